{{/* The release's name prefix: the release name, or <release>-vipd when it does not contain "vipd". */}}
{{- define "vipd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "vipd.labels" -}}
app.kubernetes.io/part-of: vipd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "vipd.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* VIPD_CONTROLLERS: the enabled controllers, in vipd's order. */}}
{{- define "vipd.controllerList" -}}
{{- $c := .Values.controllers -}}
{{- $list := list -}}
{{- range $n := list "floatingippool" "nodednsrecordset" "services" "ipam" -}}
{{- if index $c $n -}}{{- $list = append $list $n -}}{{- end -}}
{{- end -}}
{{- join "," $list -}}
{{- end -}}

{{- define "vipd.controllersSA" -}}
{{- .Values.serviceAccount.controllersName | default (printf "%s-controllers" (include "vipd.fullname" .)) -}}
{{- end -}}

{{- define "vipd.nodeSA" -}}
{{- .Values.serviceAccount.nodeName | default (printf "%s-node" (include "vipd.fullname" .)) -}}
{{- end -}}

{{- define "vipd.gossipSecret" -}}
{{- .Values.node.gossipKey.existingSecret | default (printf "%s-gossip" (include "vipd.fullname" .)) -}}
{{- end -}}

{{/* Extra settings: a map of name -> value, rendered as env entries. */}}
{{- define "vipd.extraEnv" -}}
{{- range $k, $v := . -}}
- name: {{ $k }}
  value: {{ $v | toString | quote }}
{{ end -}}
{{- end -}}
