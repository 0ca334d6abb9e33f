{{/*
The agent as a sidecar of your app's pods. Include these from your own chart (with this chart as a
dependency) or see `sluice inject` for plain manifests. Each takes a dict:

  (dict "Values" .Values.sluice "Release" .Release "Chart" .Chart)

where `.Values.sluice` is this chart's values block (its `sidecar`, `image`, `kafka` keys).

  initContainers:                       # sidecar.native: true (Kubernetes >= 1.29)
    {{- include "sluice.sidecar.initContainers" $ctx | nindent 8 }}
  containers:
    - name: app
      env:
        {{- include "sluice.sidecar.env" $ctx | nindent 12 }}
      volumeMounts:
        {{- include "sluice.sidecar.appVolumeMounts" $ctx | nindent 12 }}
    {{- include "sluice.sidecar.containers" $ctx | nindent 8 }}   # sidecar.native: false
  volumes:
    {{- include "sluice.sidecar.volumes" $ctx | nindent 8 }}
*/}}

{{- define "sluice.sidecar.configMapName" -}}
{{- $values := .Values -}}
{{- default (printf "%s-sluice-agent" .Release.Name) $values.sidecar.configMapName -}}
{{- end -}}

{{/* The agent container. Native: it runs as an init container that keeps running. */}}
{{- define "sluice.sidecar.container" -}}
{{- $values := .Values -}}
{{- $sidecar := $values.sidecar -}}
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
    {{- range $values.kafka.secretProperties }}
    - name: {{ .env }}
      valueFrom:
        secretKeyRef:
          name: {{ .secretName }}
          key: {{ .secretKey }}
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
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities:
      drop: ["ALL"]
    seccompProfile:
      type: RuntimeDefault
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

{{/* Volumes: the shared socket directory, the agent's config, the pod's labels and annotations (agent.pod_info), the spool (size-limited). */}}
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
{{- end -}}
