{{/* The name of the release's objects: the release name, with "-gpuiso" unless it names gpuiso already. */}}
{{- define "gpuiso.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The plugin's objects: DaemonSet, ServiceAccount, roles. */}}
{{- define "gpuiso.plugin" -}}
{{- printf "%s-kubelet-plugin" (include "gpuiso.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuiso.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{- define "gpuiso.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpuiso.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kubelet-plugin
{{- end -}}

{{/* Whether the node is simulated (tests). */}}
{{- define "gpuiso.simulated" -}}
{{- if or .Values.simulate.kind .Values.simulate.nodeLabel -}}true{{- end -}}
{{- end -}}

{{/* The CEL expression of the driver's devices of one type. */}}
{{- define "gpuiso.selectType" -}}
{{- printf "device.driver == %q && device.attributes[%q].type == %q" .driver .driver .type -}}
{{- end -}}
