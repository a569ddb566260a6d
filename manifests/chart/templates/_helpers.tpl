{{/*
The chart reads its objects from manifests/ (files/ links into it) and changes only what a
value sets: the namespace, the image, the operator's arguments, replicas, resources and
scheduling. Nothing here restates what manifests/ says.
*/}}

{{/* The marin3r image: repository:tag, the tag v<appVersion> unless set. */}}
{{- define "marin3r.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "v%s" .Chart.AppVersion) }}
{{- end }}

{{/* The labels helm's conventions add, beside each object's own. */}}
{{- define "marin3r.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/*
The objects of one file of manifests/, as JSON {"items": [...]}: each YAML document of the
file, `marin3r-system` (the kustomize install's namespace) replaced by the release's
namespace, with the chart's labels added. Called as (list $ "files/operator/rbac.yaml").
*/}}
{{- define "marin3r.objects" -}}
{{- $root := index . 0 -}}
{{- $file := index . 1 -}}
{{- $text := $root.Files.Get $file -}}
{{- if not $text -}}
{{- fail (printf "the chart has no %s: package it with `helm package`, which follows the links into manifests/" $file) -}}
{{- end -}}
{{- $items := list -}}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" ($text | replace "marin3r-system" $root.Release.Namespace) -1 -}}
{{- $obj := fromYaml $doc -}}
{{- if hasKey $obj "Error" -}}
{{- fail (printf "%s does not parse: %s" $file $obj.Error) -}}
{{- end -}}
{{- if $obj -}}
{{- $labels := merge (dict) (include "marin3r.labels" $root | fromYaml) ($obj.metadata.labels | default dict) -}}
{{- $_ := set $obj.metadata "labels" $labels -}}
{{- $items = append $items $obj -}}
{{- end -}}
{{- end -}}
{{- dict "items" $items | toJson -}}
{{- end }}
