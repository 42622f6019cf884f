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
{{- if not (has .Values.provider.mode (list "fti" "nec" "spec" "objects")) -}}
{{- fail "provider.mode must be fti, nec, spec or objects" -}}
{{- end -}}
{{- if not (has .Values.webhook.certificates (list "certManager" "secret" "selfManaged")) -}}
{{- fail "webhook.certificates must be certManager, secret or selfManaged" -}}
{{- end -}}
{{- if not (has .Values.deviceResourceType (list "DEVICE_PLUGIN" "DRA")) -}}
{{- fail "deviceResourceType must be DEVICE_PLUGIN or DRA" -}}
{{- end -}}
{{- if not (has (toString .Values.gpuOperator.rbac) (list "auto" "true" "false")) -}}
{{- fail "gpuOperator.rbac must be auto, true or false" -}}
{{- end -}}
{{- if and .Values.webhook.enabled (eq .Values.webhook.certificates "certManager") (not (.Capabilities.APIVersions.Has "cert-manager.io/v1")) -}}
{{- fail "webhook.certificates=certManager needs cert-manager, but this cluster does not serve cert-manager.io/v1: install cert-manager first, or use webhook.certificates=selfManaged (the default: the operator makes and renews its own certificate). Rendering offline (helm template), pass --api-versions cert-manager.io/v1" -}}
{{- end -}}
{{- if and .Values.webhook.extraNames (ne .Values.webhook.certificates "selfManaged") -}}
{{- fail "webhook.extraNames names hosts in the operator's own certificate: use it with webhook.certificates=selfManaged (with certManager or secret, put the names in that certificate)" -}}
{{- end -}}
{{- if and .Values.webhook.url (not (hasPrefix "https://" .Values.webhook.url)) -}}
{{- fail "webhook.url must start with https:// (the API server calls webhooks over TLS)" -}}
{{- end -}}
{{- end -}}

{{/* "true" when the Role in the GPU operator's namespace is rendered (gpuOperator.rbac). */}}
{{- define "cro.gpuOperatorRbac" -}}
{{- if eq .Values.deviceResourceType "DEVICE_PLUGIN" -}}
{{- $rbac := toString .Values.gpuOperator.rbac -}}
{{- if or (eq $rbac "true") (and (eq $rbac "auto") (.Capabilities.APIVersions.Has "nvidia.com/v1")) -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* host:port for a listener flag; an IPv6 address is bracketed. Call with (list addr port). */}}
{{- define "cro.listen" -}}
{{- $addr := index . 0 | toString -}}
{{- if and (contains ":" $addr) (not (hasPrefix "[" $addr)) -}}
{{- printf "[%s]:%v" $addr (index . 1) -}}
{{- else -}}
{{- printf "%s:%v" $addr (index . 1) -}}
{{- end -}}
{{- end -}}

{{/* pool.devices as CRO_POOL_DEVICES: TYPE=MODEL entries separated by ';'. */}}
{{- define "cro.poolDevices" -}}
{{- $entries := list -}}
{{- range .Values.pool.devices -}}
{{- if not (has .type (list "gpu" "cxlmemory")) -}}
{{- fail (printf "pool.devices: type %q is not gpu or cxlmemory" .type) -}}
{{- end -}}
{{- $entries = append $entries (printf "%s=%s" .type (required "pool.devices: every entry needs a model" .model)) -}}
{{- end -}}
{{- join ";" $entries -}}
{{- end -}}
