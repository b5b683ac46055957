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
# The canary workload (created, scaled, deleted) and the baseline (read, promoted), of the kind the baseline is:
# a Deployment or a StatefulSet (spec.serving.baseline.kind). list: the canaries to delete with their KVCalibration.
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Job pods: their termination messages carry the calibration and verification summaries.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# The baseline Service (read: its selector and ports) and the canary's own Service (probes, Gateway API backends).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "create", "patch", "delete"]
# spec.serving.canary.capacity fromBaseline scales the baseline down for the canary: refused where an autoscaler
# owns its replicas (read only).
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list"]
{{- if .Values.rbac.gatewayApi }}
# traffic.router gateway-api: shift HTTPRoute backend weights.
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["get", "patch"]
# traffic.shadow: the route's parent Gateway, read for its class name only (can that class mirror?).
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["gateways"]
  verbs: ["get"]
{{- end }}
{{- if .Values.rbac.inferencePool }}
# traffic.router inference-pool: the canary's own InferencePool (created once its pods are ready, deleted with the
# canary) and the baseline's (read: target ports, endpoint picker). Nothing else is written to a pool. The picker
# copy is a Deployment and a Service, granted above.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "create", "delete"]
{{- end }}
{{- if dig "probes" "readApiKeySecrets" false (.Values.policy | default dict) }}
# policy.probes.readApiKeySecrets: the API key a baseline's vLLM takes from a Secret (VLLM_API_KEY secretKeyRef), read
# when the quality probes run; never written, listed or watched, and never copied into status, events or logs.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
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
{{- if .Values.rbac.gatewayApi }}
# traffic.shadow: a GatewayClass's status.supportedFeatures (does it mirror?) before a mirror is written.
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["gatewayclasses"]
  verbs: ["get"]
{{- end }}
{{- end }}

{{/*
The Prometheus servers of policy.prometheus (the default first) as `kvcal operator run --prometheus` JSON, with the
Secret volumes and read-only mounts their CA, client certificate and credentials come from (one folder per server,
/etc/kvcal/prometheus/NAME/PART). Absent values (--reuse-values from a chart before them): kvcal 0.1's default
address, which is the operator's own default too.
*/}}
{{- define "kvcal.prometheus" -}}
{{- $policy := .Values.policy | default dict }}
{{- $legacy := dict "name" "default" "address" "http://prometheus.monitoring:9090" }}
{{- $default := dig "prometheus" "default" $legacy $policy }}
{{- $servers := prepend (dig "prometheus" "additional" list $policy) $default }}
{{- $out := dict "servers" list "volumes" list "mounts" list }}
{{- $names := dict }}
{{- range $i, $server := $servers }}
{{- if hasKey $names $server.name }}
{{- fail (printf "policy.prometheus: two servers are named %s (a spec picks one by name)" $server.name) }}
{{- end }}
{{- $_ := set $names $server.name true }}
{{- $address := trimSuffix "/" $server.address }}
{{- if hasKey $names $address }}
{{- fail (printf "policy.prometheus: two servers have the address %s (a spec picks one by address)" $address) }}
{{- end }}
{{- $_ := set $names $address true }}
{{- $dir := printf "/etc/kvcal/prometheus/%s" $server.name }}
{{- $access := dict "name" $server.name "address" $server.address }}
{{- /* Each part: the Secret named in the values, its keys and the --prometheus field each key's path goes to. */}}
{{- $parts := list
  (dict "part" "ca" "secret" (dig "tls" "caSecret" "" $server)
        "files" (dict "ca.crt" "caFile"))
  (dict "part" "client" "secret" (dig "tls" "clientCertSecret" "" $server)
        "files" (dict "tls.crt" "certFile" "tls.key" "keyFile"))
  (dict "part" "token" "secret" (dig "auth" "bearerTokenSecret" "" $server)
        "files" (dict "token" "bearerTokenFile"))
  (dict "part" "basic" "secret" (dig "auth" "basicAuthSecret" "" $server)
        "files" (dict "username" "usernameFile" "password" "passwordFile")) }}
{{- range $part := $parts }}
{{- if $part.secret }}
{{- $volume := printf "prometheus-%d-%s" $i $part.part }}
{{- $items := list }}
{{- range $key, $field := $part.files }}
{{- $items = append $items (dict "key" $key "path" $key) }}
{{- $_ := set $access $field (printf "%s/%s/%s" $dir $part.part $key) }}
{{- end }}
{{- /* defaultMode 0440: readable by the operator's group (fsGroup), by nobody else. */}}
{{- $secret := dict "secretName" $part.secret "items" $items "defaultMode" 288 }}
{{- $_ := set $out "volumes" (append $out.volumes (dict "name" $volume "secret" $secret)) }}
{{- $mount := dict "name" $volume "mountPath" (printf "%s/%s" $dir $part.part) "readOnly" true }}
{{- $_ := set $out "mounts" (append $out.mounts $mount) }}
{{- end }}
{{- end }}
{{- $_ := set $out "servers" (append $out.servers $access) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The webhooks of notifications.webhooks as `kvcal operator run --notify` JSON, with the Secret volumes and read-only
mounts their URL and token come from (/etc/kvcal/notify/NAME/url/url, .../token/token). Absent values
(--reuse-values from a chart before them): none.
*/}}
{{- define "kvcal.notifications" -}}
{{- $webhooks := dig "webhooks" list (.Values.notifications | default dict) }}
{{- $out := dict "webhooks" list "volumes" list "mounts" list }}
{{- $names := dict }}
{{- range $i, $webhook := $webhooks }}
{{- if hasKey $names $webhook.name }}
{{- fail (printf "notifications.webhooks: two webhooks are named %s (status.notifications tells them apart by name)" $webhook.name) }}
{{- end }}
{{- $_ := set $names $webhook.name true }}
{{- $dir := printf "/etc/kvcal/notify/%s" $webhook.name }}
{{- $target := dict "name" $webhook.name "format" ($webhook.format | default "json") "urlFile" (printf "%s/url/url" $dir) }}
{{- with $webhook.events }}
{{- $_ := set $target "events" . }}
{{- end }}
{{- $parts := list (dict "part" "url" "secret" $webhook.urlSecret) }}
{{- if $webhook.tokenSecret }}
{{- $parts = append $parts (dict "part" "token" "secret" $webhook.tokenSecret) }}
{{- $_ := set $target "tokenFile" (printf "%s/token/token" $dir) }}
{{- end }}
{{- range $part := $parts }}
{{- $volume := printf "notify-%d-%s" $i $part.part }}
{{- /* defaultMode 0440: readable by the operator's group (fsGroup), by nobody else. */}}
{{- $secret := dict "secretName" $part.secret "items" (list (dict "key" $part.part "path" $part.part)) "defaultMode" 288 }}
{{- $_ := set $out "volumes" (append $out.volumes (dict "name" $volume "secret" $secret)) }}
{{- $mount := dict "name" $volume "mountPath" (printf "%s/%s" $dir $part.part) "readOnly" true }}
{{- $_ := set $out "mounts" (append $out.mounts $mount) }}
{{- end }}
{{- $_ := set $out "webhooks" (append $out.webhooks $target) }}
{{- end }}
{{- toJson $out }}
{{- end }}
