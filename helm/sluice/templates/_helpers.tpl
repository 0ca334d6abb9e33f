{{/* Names and labels. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "sluice.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "sluice.labels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The persisters' own names, labels and selectors: _persisters.tpl. */}}

{{/* The example app container's securityContext: the hardening, no uid (the image's, 65532, or
     the one the platform assigns). */}}
{{- define "sluice.securityContext" -}}
runAsNonRoot: true
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
TOML from a values map: the chart's config values mirror sluice's TOML keys one to one.
(Helm's toToml would print integers that went through YAML as floats, e.g. 200000.0.)
*/}}
{{- define "sluice.toml.value" -}}
{{- if kindIs "string" . -}}{{ . | quote }}
{{- else if kindIs "bool" . -}}{{ . }}
{{- else if or (kindIs "float64" .) (kindIs "float32" .) -}}
{{- if eq (float64 .) (float64 (int64 .)) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else if kindIs "slice" . -}}[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "sluice.toml.value" $v }}{{ end }}]
{{- else if kindIs "map" . -}}{ {{- range $i, $k := keys . | sortAlpha }}{{ if $i }}, {{ end }}{{ include "sluice.toml.key" $k }} = {{ include "sluice.toml.value" (get $ $k) }}{{ end -}} }
{{- else -}}{{ . }}
{{- end -}}
{{- end -}}

{{- define "sluice.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ . | quote }}{{ end -}}
{{- end -}}

{{- define "sluice.toml.table" -}}
{{- $path := .path -}}
{{- $table := .table -}}
{{- $hasScalars := false -}}
{{- range $key, $value := $table }}{{ if not (kindIs "map" $value) }}{{ $hasScalars = true }}{{ end }}{{ end -}}
{{- if and $path (or $hasScalars (not $table)) }}
[{{ $path }}]
{{- end }}
{{- range $key, $value := $table }}
{{- if not (kindIs "map" $value) }}
{{ include "sluice.toml.key" $key }} = {{ include "sluice.toml.value" $value }}
{{- end }}
{{- end }}
{{- range $key, $value := $table }}
{{- if kindIs "map" $value }}
{{- $child := ternary (include "sluice.toml.key" $key) (printf "%s.%s" $path (include "sluice.toml.key" $key)) (eq $path "") }}
{{- include "sluice.toml.table" (dict "path" $child "table" $value) }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "sluice.toml" -}}
{{- include "sluice.toml.table" (dict "path" "" "table" .) | trim }}
{{ end -}}

{{/* Environment that carries secrets into sluice (never inline in a ConfigMap). */}}
{{- define "sluice.secretEnv" -}}
{{- range .Values.kafka.secretProperties }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .secretKey }}
{{- end }}
{{- end -}}

{{/* The Kafka section both configs share: brokers, topic (and, templated, its default and cap), properties, secret properties by env. */}}
{{- define "sluice.kafkaConfig" -}}
{{- $fromEnv := dict -}}
{{- range .Values.kafka.secretProperties }}{{ $_ := set $fromEnv .property .env }}{{ end -}}
{{- $kafka := dict "brokers" .Values.kafka.brokers "topic" .Values.kafka.topic "properties" .Values.kafka.properties "properties_from_env" $fromEnv -}}
{{- if contains "{" .Values.kafka.topic }}{{ $_ := set $kafka "default_topic" .Values.kafka.defaultTopic }}{{ $_ := set $kafka "max_topics" .Values.kafka.maxTopics }}{{ end -}}
{{- toJson $kafka -}}
{{- end -}}
