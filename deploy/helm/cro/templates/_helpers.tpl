{{/* The name every object of this release starts with. */}}
{{- define "cro.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cro.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "cro.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
control-plane: controller-manager
{{- end -}}

{{- define "cro.serviceAccountName" -}}
{{ include "cro.fullname" . }}-controller
{{- end -}}

{{- define "cro.webhookSecretName" -}}
{{- if eq .Values.webhook.certificates "secret" -}}
{{- required "webhook.secretName is required with webhook.certificates=secret" .Values.webhook.secretName -}}
{{- else -}}
{{ include "cro.fullname" . }}-webhook-tls
{{- end -}}
{{- end -}}

{{/*
The operator looks for the node agent's pods in the Go operator's namespace, so a release
with the agent must live there.
*/}}
{{- define "cro.checkNamespace" -}}
{{- if and .Values.nodeAgent.enabled (ne .Release.Namespace "composable-resource-operator-system") -}}
{{- fail "with nodeAgent.enabled, install into namespace composable-resource-operator-system (where the operator looks for the agent)" -}}
{{- end -}}
{{- if not (has .Values.provider.mode (list "fti" "spec" "objects")) -}}
{{- fail "provider.mode must be fti, spec or objects" -}}
{{- end -}}
{{- if not (has .Values.webhook.certificates (list "certManager" "secret" "selfManaged")) -}}
{{- fail "webhook.certificates must be certManager, secret or selfManaged" -}}
{{- end -}}
{{- if not (has .Values.deviceResourceType (list "DEVICE_PLUGIN" "DRA")) -}}
{{- fail "deviceResourceType must be DEVICE_PLUGIN or DRA" -}}
{{- end -}}
{{- end -}}
