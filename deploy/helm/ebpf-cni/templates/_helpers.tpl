{{/* Labels every object carries, as deploy/ebpf-cni.yaml has them. */}}
{{- define "ebpf-cni.labels" -}}
app.kubernetes.io/name: ebpf-cni
{{- end -}}

{{- define "ebpf-cni.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
