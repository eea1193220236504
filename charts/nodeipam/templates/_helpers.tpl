{{/* The name of every object (deploy/ uses nodeipam-controller). */}}
{{- define "nodeipam.fullname" -}}
{{- default "nodeipam-controller" .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The labels deploy/'s kustomization puts on every object, plus Helm's own. */}}
{{- define "nodeipam.labels" -}}
app.kubernetes.io/name: nodeipam-controller
app.kubernetes.io/part-of: nodeipam
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | quote }}
{{- end -}}

{{/* The controller Pods' labels; the Deployment, PodDisruptionBudget, Service and pod
anti-affinity select them. */}}
{{- define "nodeipam.selectorLabels" -}}
app.kubernetes.io/name: nodeipam-controller
app.kubernetes.io/component: controller
{{- end -}}

{{- define "nodeipam.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "nodeipam.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "nodeipam.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.resourceNamespace -}}
{{- end -}}
