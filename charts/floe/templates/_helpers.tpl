{{/* Names, labels and small pieces the templates share. */}}

{{- define "floe.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: "<release>-floe", or the release name when it contains "floe". */}}
{{- define "floe.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "floe.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "floe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "floe.operatorSelector" -}}
app.kubernetes.io/name: {{ include "floe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "floe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "floe.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "floe.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The metrics Service's name; with a ServiceMonitor it is also Prometheus's `job` label. */}}
{{- define "floe.metricsService" -}}
{{- printf "%s-metrics" (include "floe.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Namespaces with sandbox pods, for the sandbox NetworkPolicy. */}}
{{- define "floe.sandboxNamespaces" -}}
{{- $ns := .Values.networkPolicy.sandbox.namespaces -}}
{{- if and (not $ns) .Values.operator.watchNamespace -}}
{{- $ns = list .Values.operator.watchNamespace -}}
{{- end -}}
{{- toJson $ns -}}
{{- end -}}

{{/* The operator's namespace as a NetworkPolicy namespaceSelector. */}}
{{- define "floe.operatorNamespaceSelector" -}}
{{- if .Values.networkPolicy.sandbox.operatorNamespaceSelector -}}
{{- toYaml .Values.networkPolicy.sandbox.operatorNamespaceSelector -}}
{{- else -}}
matchLabels:
  kubernetes.io/metadata.name: {{ .Release.Namespace }}
{{- end -}}
{{- end -}}

{{/* The apiserver as the operator's NetworkPolicy must name it, as JSON {cidrs, ports,
detected}: the values' CIDRs and ports when CIDRs are given; else the addresses and ports of
the default/kubernetes Endpoints, read from the cluster (Helm's lookup: on install and
upgrade, empty under `helm template`); else no CIDR (any address) on the values' ports. */}}
{{- define "floe.apiServerEndpoints" -}}
{{- $given := .Values.networkPolicy.operator.apiServer -}}
{{- $out := dict "cidrs" $given.cidrs "ports" $given.ports "detected" false -}}
{{- if not $given.cidrs -}}
{{- $endpoints := lookup "v1" "Endpoints" "default" "kubernetes" -}}
{{- $cidrs := list -}}
{{- $ports := list -}}
{{- range ($endpoints.subsets | default list) -}}
{{- range (.addresses | default list) -}}
{{- $cidrs = append $cidrs (printf "%s/%s" .ip (ternary "128" "32" (contains ":" .ip))) -}}
{{- end -}}
{{- range (.ports | default list) -}}
{{- $ports = append $ports .port -}}
{{- end -}}
{{- end -}}
{{- if and $cidrs $ports -}}
{{- $out = dict "cidrs" ($cidrs | uniq) "ports" ($ports | uniq) "detected" true -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}
