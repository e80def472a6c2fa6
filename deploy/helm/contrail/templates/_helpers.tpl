{{/* The release's full name. */}}
{{- define "contrail.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The name of a stage's objects: <fullname>-<stage>. Call with (dict "root" $ "stage" $name). */}}
{{- define "contrail.stageName" -}}
{{- printf "%s-%s" (include "contrail.fullname" .root) .stage | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "contrail.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of a stage. Call with (dict "root" $ "stage" $name). */}}
{{- define "contrail.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .stage }}
{{- end -}}

{{/* The image of a stage. */}}
{{- define "contrail.image" -}}
{{- printf "%s/%s:%s" .root.Values.image.repository .stage (default .root.Chart.AppVersion .root.Values.image.tag) -}}
{{- end -}}

{{/* The Secret holding connection strings, keys and tokens. */}}
{{- define "contrail.secretName" -}}
{{- default (printf "%s-secrets" (include "contrail.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* The ServiceAccount. */}}
{{- define "contrail.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "contrail.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}
