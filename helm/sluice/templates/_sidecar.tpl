{{/*
The agent as a sidecar of your app's pods. Include these from your own chart (with this chart as a
dependency) or see `sluice inject` for plain manifests. Each takes this chart's own scope, which
Helm hands a parent chart as `.Subcharts.sluice` (the dependency's name, or its alias): its
`.Values` are this chart's values as the parent set them, its `.Chart` this chart's, so the
image tag defaults to sluice's appVersion, never the parent's.

  {{- $sluice := .Subcharts.sluice }}
  terminationGracePeriodSeconds: {{ include "sluice.sidecar.terminationGracePeriodSeconds" $sluice }}
  securityContext:
    {{- include "sluice.sidecar.fsGroup" $sluice | nindent 4 }}
  initContainers:                       # sidecar.native: true (Kubernetes >= 1.29)
    {{- include "sluice.sidecar.initContainers" $sluice | nindent 4 }}
  containers:
    - name: app
      env:
        {{- include "sluice.sidecar.env" $sluice | nindent 8 }}
      volumeMounts:
        {{- include "sluice.sidecar.appVolumeMounts" $sluice | nindent 8 }}
    {{- include "sluice.sidecar.containers" $sluice | nindent 4 }}   # sidecar.native: false
  volumes:
    {{- include "sluice.sidecar.volumes" $sluice | nindent 4 }}

helm/examples/app is a chart that does this; tests/it/chart.rs renders and validates it.
*/}}

{{/* The scope's values, refusing a scope whose .Chart may not be this chart's (a hand-made dict
     with the parent's .Chart would make the parent's appVersion the sluice image's tag). */}}
{{- define "sluice.sidecar.check" -}}
{{- if and (not (hasKey . "Subcharts")) (not .Values.image.tag) -}}
{{- fail "sluice.sidecar.* templates: pass the sluice chart's own scope, .Subcharts.sluice (or .Subcharts.<alias>), not a dict: a dict's .Chart is your chart's, whose appVersion would become the sluice image's tag. Or set sluice.image.tag." -}}
{{- end -}}
{{- end -}}

{{- define "sluice.sidecar.configMapName" -}}
{{- $values := .Values -}}
{{- default (printf "%s-sluice-agent" .Release.Name) $values.sidecar.configMapName -}}
{{- end -}}

{{/* Whole seconds, rounded up, of a sluice duration ("25s", "500ms", "1m", "2 h"). */}}
{{- define "sluice.durationSeconds" -}}
{{- $text := . | toString | nospace -}}
{{- $number := regexFind "^[0-9]+" $text | int64 -}}
{{- $unit := regexReplaceAll "^[0-9]+" $text "" -}}
{{- $units := dict "ns" (list 1 1000000000) "us" (list 1 1000000) "ms" (list 1 1000) "s" (list 1 1) "m" (list 60 1) "min" (list 60 1) "h" (list 3600 1) "d" (list 86400 1) -}}
{{- $ratio := get $units $unit | default (list 1 1) -}}
{{- div (add (mul $number (index $ratio 0)) (sub (index $ratio 1) 1)) (index $ratio 1) -}}
{{- end -}}

{{/*
The pod's terminationGracePeriodSeconds: the app's shutdown (sidecar.appShutdownSeconds; a regular
sidecar's preStop wait if longer), then the agent's drain (agent.drain_timeout), then 5 s for its
producer's close and final count. `sluice inject` sets the same.
*/}}
{{- define "sluice.sidecar.terminationGracePeriodSeconds" -}}
{{- $sidecar := .Values.sidecar -}}
{{- $drain := include "sluice.durationSeconds" (dig "agent" "drain_timeout" "20s" ($sidecar.config | default dict)) | int64 -}}
{{- $before := $sidecar.appShutdownSeconds | int64 -}}
{{- if not $sidecar.native -}}
{{- $before = max $before (include "sluice.durationSeconds" $sidecar.preStopWait | int64) -}}
{{- end -}}
{{- add $before $drain 5 -}}
{{- end -}}

{{/*
The pod's fsGroup (a line for its securityContext; nothing when sidecar.fsGroup is null, for a
platform that assigns one, like OpenShift's restricted SCC). The socket is mode 0660: Kubernetes
makes the emptyDir group-owned by the fsGroup, so the socket is too, and adds it to every
container's groups. A pod that already sets an fsGroup needs none of this: any value works.
*/}}
{{- define "sluice.sidecar.fsGroup" -}}
{{- if not (kindIs "invalid" .Values.sidecar.fsGroup) -}}
fsGroup: {{ .Values.sidecar.fsGroup | int64 }}
{{- end -}}
{{- end -}}

{{/* The agent container. Native: it runs as an init container that keeps running. */}}
{{- define "sluice.sidecar.container" -}}
{{- include "sluice.sidecar.check" . -}}
{{- $values := .Values -}}
{{- $sidecar := $values.sidecar -}}
{{- if and $sidecar.native .Capabilities (semverCompare "<1.29.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "sluice: a native sidecar (sidecar.native=true) needs Kubernetes 1.29 or later (this is %s; older ones keep the init container from ever finishing): set sidecar.native=false, or pass --kube-version when rendering offline" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
- name: sluice
  image: {{ printf "%s:%s" $values.image.repository (default .Chart.AppVersion $values.image.tag) | quote }}
  imagePullPolicy: {{ $values.image.pullPolicy }}
  {{- if $sidecar.native }}
  restartPolicy: Always
  {{- end }}
  args: ["agent", "--config", "/etc/sluice/agent.toml"]
  env:
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    # An otlp listener refuses its loopback addresses where POD_IP = HOST_IP (hostNetwork).
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: HOST_IP
      valueFrom:
        fieldRef:
          fieldPath: status.hostIP
    - name: CONTAINER_NAME
      value: {{ $sidecar.appContainerName | quote }}
    # The admin port the container declares, whatever the ConfigMap it reads says.
    - name: SLUICE_AGENT__ADMIN_LISTEN
      value: {{ printf "0.0.0.0:%d" ($sidecar.adminPort | int) | quote }}
    {{- range $values.kafka.secretProperties }}
    - name: {{ .env }}
      valueFrom:
        secretKeyRef:
          name: {{ .secretName }}
          key: {{ .secretKey }}
    {{- end }}
    {{- with $sidecar.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: sluice-admin
      containerPort: {{ $sidecar.adminPort }}
      protocol: TCP
  # The agent binds its socket before its admin server answers, so /healthz answering means
  # the socket is listening: the app may start. /readyz never follows Kafka.
  {{- with $sidecar.probes.startup }}
  startupProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $sidecar.probes.readiness }}
  readinessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $sidecar.probes.liveness }}
  livenessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if not $sidecar.native }}
  lifecycle:
    preStop:
      exec:
        command: ["sluice", "pre-stop", "--wait", {{ $sidecar.preStopWait | quote }}]
  {{- end }}
  resources:
    {{- toYaml $sidecar.resources | nindent 4 }}
  {{- with $sidecar.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: sluice-socket
      mountPath: /run/sluice
    - name: sluice-config
      mountPath: /etc/sluice
      readOnly: true
    - name: sluice-podinfo
      mountPath: /etc/podinfo
      readOnly: true
    {{- if eq $sidecar.buffer "disk" }}
    - name: sluice-spool
      mountPath: /var/lib/sluice
    {{- end }}
    {{- with $sidecar.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* The container where it belongs: under initContainers when native... */}}
{{- define "sluice.sidecar.initContainers" -}}
{{- if .Values.sidecar.native }}
{{- include "sluice.sidecar.container" . }}
{{- end }}
{{- end -}}

{{/* ...under containers otherwise. */}}
{{- define "sluice.sidecar.containers" -}}
{{- if not .Values.sidecar.native }}
{{- include "sluice.sidecar.container" . }}
{{- end }}
{{- end -}}

{{/* The app container's environment: where to write. */}}
{{- define "sluice.sidecar.env" -}}
- name: SLUICE_SOCKET
  value: /run/sluice/sluice.sock
{{- end -}}

{{/* The app container's mount of the socket directory. */}}
{{- define "sluice.sidecar.appVolumeMounts" -}}
- name: sluice-socket
  mountPath: /run/sluice
{{- end -}}

{{/* Volumes: the shared socket directory, the agent's config, the pod's labels and annotations (agent.pod_info), the spool (size-limited), sidecar.extraVolumes. */}}
{{- define "sluice.sidecar.volumes" -}}
{{- $sidecar := .Values.sidecar -}}
- name: sluice-socket
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
- name: sluice-config
  configMap:
    name: {{ include "sluice.sidecar.configMapName" . }}
- name: sluice-podinfo
  downwardAPI:
    items:
      - path: labels
        fieldRef:
          fieldPath: metadata.labels
      - path: annotations
        fieldRef:
          fieldPath: metadata.annotations
{{- if eq $sidecar.buffer "disk" }}
- name: sluice-spool
  emptyDir:
    sizeLimit: {{ $sidecar.spoolSizeLimit }}
{{- end }}
{{- with $sidecar.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}
