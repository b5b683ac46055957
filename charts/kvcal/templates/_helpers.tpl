{{/* Names: <release>-kvcal unless the release name already says kvcal. */}}
{{- define "kvcal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvcal.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kvcal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvcal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "kvcal.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvcal.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvcal
{{- end }}

{{- define "kvcal.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvcal.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The namespace the operator watches when rbac.scope is namespace (default: the release namespace). */}}
{{- define "kvcal.watchNamespace" -}}
{{- default .Release.Namespace .Values.watchNamespace }}
{{- end }}

{{- define "kvcal.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The operator's API permissions, shared by the ClusterRole and the namespaced Role. Every verb is named:
no wildcards. Keep in step with what kvcal.adapters.kube and kopf call (tests/integration/test_chart_install.py
replays each call under the chart's ServiceAccount token).
*/}}
{{- define "kvcal.namespacedRules" -}}
# The custom resource: kopf watches it and patches metadata (finalizer, annotations) and status.
- apiGroups: ["kvcal.dev"]
  resources: ["kvcalibrations"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["kvcal.dev"]
  resources: ["kvcalibrations/status"]
  verbs: ["get", "patch", "update"]
# Events about each phase: kopf and the operator only ever POST new core/v1 events (events.k8s.io for newer clients).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
# Calibration and verification Jobs, and the ConfigMap carrying each Job's config.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The canary Deployment (created, scaled, deleted) and the baseline (read, scaled, promoted).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Job pods: their termination messages carry the calibration and verification summaries.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# The baseline Service (read: its selector and ports) and the canary's own Service (probes, Gateway API backends).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "create", "patch", "delete"]
{{- if .Values.rbac.gatewayApi }}
# traffic.router gateway-api: shift HTTPRoute backend weights.
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["get", "patch"]
{{- end }}
{{- end }}

{{/* Cluster-scoped reads kopf's discovery (settings.scanning) makes: CRDs, and namespaces (it lists them even
when told to serve one namespace). Read-only; names of namespaces and CRDs only. */}}
{{- define "kvcal.discoveryRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
{{- end }}
