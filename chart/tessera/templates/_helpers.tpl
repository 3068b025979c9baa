{{/* Labels every object of the chart carries. */}}
{{- define "tessera.labels" -}}
app.kubernetes.io/part-of: tessera
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* image: "tessera.image" (list . .Values.image.node) */}}
{{- define "tessera.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- $tag := $img.tag | default $root.Chart.AppVersion -}}
{{- if $root.Values.image.registry -}}
{{ printf "%s/%s:%s" $root.Values.image.registry $img.repository $tag }}
{{- else -}}
{{ printf "%s:%s" $img.repository $tag }}
{{- end -}}
{{- end -}}

{{- define "tessera.pullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
- name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}
