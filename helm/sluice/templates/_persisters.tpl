{{/*
The persister deployments. With `persisters` empty, one: `persister` itself, named and labelled
as it always was. Otherwise one per item of `persisters` (one per PostgreSQL cluster, each with
its own consumer group and topics), the item deep-merged over `persister`, named
<fullname>-persister-<name> and told apart by the label sluice.dev/persister: <name>.

Each persister-*.yaml renders its kind for every entry of the list this fills in:
  {{- $persisters := dict }}{{- include "sluice.persisters" (dict "root" . "out" $persisters) }}
  {{- range $i, $p := $persisters.list }} … {{- end }}
An entry ($p) is a dict: root (the chart's scope), values (the merged persister values), id (the
item's name, "" for `persister` alone), name (its resources' name).
It fills .out instead of returning text because a template returns only a string, and values
sent through JSON would come back with every integer a float.
*/}}
{{- define "sluice.persisters" -}}
{{- $root := .root -}}
{{- $base := $root.Values.persister -}}
{{- $fullname := include "sluice.fullname" $root -}}
{{- $list := list -}}
{{- if not $root.Values.persisters -}}
{{- if $base.enabled -}}
{{- $list = append $list (dict "root" $root "values" $base "id" "" "name" (printf "%s-persister" $fullname)) -}}
{{- end -}}
{{- else -}}
{{- $names := dict -}}
{{- range $item := $root.Values.persisters -}}
{{- $id := toString $item.name -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $id) -}}
{{- fail (printf "persisters: name %q must be a DNS label (lower case letters, digits and '-')" $id) -}}
{{- end -}}
{{- if hasKey $names $id -}}
{{- fail (printf "persisters: two items are named %q; each needs a name of its own" $id) -}}
{{- end -}}
{{- $_ := set $names $id true -}}
{{- $name := printf "%s-persister-%s" $fullname $id -}}
{{- if gt (len $name) 63 -}}
{{- fail (printf "persisters: %q is longer than 63 characters (a Service's limit): shorten the item's name, or set fullnameOverride" $name) -}}
{{- end -}}
{{- $values := deepCopy $base -}}
{{- include "sluice.mergeValues" (dict "into" $values "from" (omit (deepCopy $item) "name")) -}}
{{- if $values.enabled -}}
{{- $list = append $list (dict "root" $root "values" $values "id" $id "name" $name) -}}
{{- end -}}
{{- end -}}
{{- include "sluice.persisters.check" (dict "root" $root "list" $list) -}}
{{- end -}}
{{- $_ := set .out "list" $list -}}
{{- end -}}

{{/*
What would make two persisters of the list collide, refused at render: one consumer group shared
(they would split each other's partitions, each cluster getting part of the other's records), one
topic or pattern read by two (every record stored twice), several persisters where one reads the
default topics (it would read every other's too), a ServiceAccount created twice, HPA and KEDA on
one Deployment.
*/}}
{{- define "sluice.persisters.check" -}}
{{- $groups := dict -}}
{{- $topics := dict -}}
{{- $accounts := dict -}}
{{- $several := gt (len .list) 1 -}}
{{- range $p := .list -}}
{{- $v := $p.values -}}
{{- $group := toString (dig "persist" "group_id" "" $v.config) -}}
{{- with get $groups $group -}}
{{- fail (printf "persisters: %q and %q both use consumer group %q (config.persist.group_id): give each its own, or they share the partitions and each cluster gets part of the other's records" . $p.id $group) -}}
{{- end -}}
{{- $_ := set $groups $group $p.id -}}
{{- $reads := dig "persist" "topics" list $v.config -}}
{{- if and $several (not $reads) -}}
{{- fail (printf "persisters: %q sets no config.persist.topics: with several persisters each names the topics (or ^patterns) it reads, or it reads the default ones (kafka.topic) and every other's" $p.id) -}}
{{- end -}}
{{- range $topic := $reads -}}
{{- with get $topics (toString $topic) -}}
{{- fail (printf "persisters: %q and %q both read %q (config.persist.topics): every record of it would be stored twice" . $p.id $topic) -}}
{{- end -}}
{{- $_ := set $topics (toString $topic) $p.id -}}
{{- end -}}
{{- if and $v.autoscaling.enabled $v.keda.enabled -}}
{{- fail (printf "persisters: %q enables both autoscaling and keda: one Deployment takes one" $p.id) -}}
{{- end -}}
{{- if $v.serviceAccount.create -}}
{{- $account := include "sluice.persister.serviceAccountName" $p -}}
{{- with get $accounts $account -}}
{{- fail (printf "persisters: %q and %q both create ServiceAccount %q: give each its own serviceAccount.name, or create it in one and set create: false in the other" . $p.id $account) -}}
{{- end -}}
{{- $_ := set $accounts $account $p.id -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
.from's keys set into .into, maps merged key by key, anything else replaced. Not Sprig's
mergeOverwrite: it skips "empty" values, so an item's `enabled: false`, `replicas: 0`, `""` or
`null` would not override the defaults.
*/}}
{{- define "sluice.mergeValues" -}}
{{- $into := .into -}}
{{- range $key, $value := .from -}}
{{- $current := get $into $key -}}
{{- if and (kindIs "map" $value) (kindIs "map" $current) -}}
{{- include "sluice.mergeValues" (dict "into" $current "from" $value) -}}
{{- else -}}
{{- $_ := set $into $key $value -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A persister's labels beside sluice.labels (an entry of sluice.persisters). */}}
{{- define "sluice.persister.labels" -}}
{{ include "sluice.labels" .root }}
app.kubernetes.io/component: persister
{{- with .id }}
sluice.dev/persister: {{ . }}
{{- end }}
{{- end -}}

{{/* A persister's pod selector: its own pods only, never another's of the list. */}}
{{- define "sluice.persister.selector" -}}
app.kubernetes.io/name: {{ include "sluice.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: persister
{{- with .id }}
sluice.dev/persister: {{ . }}
{{- end }}
{{- end -}}

{{/* A persister's ServiceAccount: its own when created, else the one named (or the namespace's default). */}}
{{- define "sluice.persister.serviceAccountName" -}}
{{- if .values.serviceAccount.create -}}
{{- default .name .values.serviceAccount.name -}}
{{- else -}}
{{- .values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* A persister's ConfigMap: persister-configmap.yaml renders it, the Deployment hashes it (the
     text the whole file was before the list, so the default persister's hash stays the same). */}}
{{- define "sluice.persister.configMap" -}}
{{- $v := .values }}
{{- $config := deepCopy $v.config }}
{{- $postgres := dict }}
{{- if $v.postgresCaSecret }}
{{- $_ := set $postgres "ca_file" "/etc/sluice/postgres-ca/ca.crt" }}
{{- end }}
{{- $fixed := dict
  "kafka" (include "sluice.kafkaConfig" .root | fromJson)
  "persist" (dict "admin_listen" (printf "0.0.0.0:%v" $v.adminPort))
  "postgres" $postgres
}}
{{- $config = mustMergeOverwrite $config $fixed }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .name }}
  labels:
    {{- include "sluice.persister.labels" . | nindent 4 }}
data:
  persist.toml: |
    {{- include "sluice.toml" $config | nindent 4 }}
{{ end -}}
