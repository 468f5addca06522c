{{/* Names and labels shared by every template. */}}

{{- define "guardedcron.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "guardedcron.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "guardedcron.selectorLabels" -}}
app.kubernetes.io/name: {{ include "guardedcron.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "guardedcron.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "guardedcron.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: guardedcron
{{- end -}}

{{- define "guardedcron.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "guardedcron.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator image: by digest when one is given, else by tag (default: appVersion). */}}
{{- define "guardedcron.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "guardedcron.guardImage" -}}
{{- default (include "guardedcron.image" .) .Values.guard.image -}}
{{- end -}}

{{- define "guardedcron.clusterWide" -}}
{{- if not .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/*
The operator's RBAC rules, written out one by one (docs/design.md, "RBAC").
Called with (dict "root" $ "clusterWide" bool).
*/}}
{{- define "guardedcron.rbacRules" -}}
{{- $values := .root.Values -}}
# The custom resource: watched, annotated by kopf (progress), never created or deleted.
- apiGroups: ["guardedcron.io"]
  resources: ["guardedcronjobs"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["guardedcron.io"]
  resources: ["guardedcronjobs/status"]
  verbs: ["get", "patch", "update"]
# The CronJobs it owns: server-side apply (patch, and create when missing); garbage
# collection through owner references deletes them with their GuardedCronJob. delete:
# for its own CronJob whose runs would take a lock the namespace may no longer use
# (a shared lock taken off the allow-list; docs/design.md, "Multi-tenant clusters").
- apiGroups: ["batch"]
  resources: ["cronjobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Jobs: read back run status; create for manual runs (guardedcron.io/trigger); delete a
# skipped run's Job once status records it (so it is not left as a Failed Job).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Pods: read the guard's exit code and termination message.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# Events about GuardedCronJobs (kopf posts core/v1 Events; events.k8s.io for series).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .clusterWide }}
# kopf watches CRDs to notice served resources appearing or changing.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- end }}
{{- if $values.peering.enabled }}
# kopf peering: keep-alives in the peering object's status.
- apiGroups: ["kopf.dev"]
  resources: [{{ ternary "clusterkopfpeerings" "kopfpeerings" .clusterWide | quote }}]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- if $values.stopWorkload.enabled }}
# onLost: StopWorkload: delete the pod of a run whose lease was lost. Only delete.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["delete"]
{{- end }}
{{- if $values.outcomeRecording.enabled }}
# Outcome recording: read the DSN Secret named by a GuardedCronJob. Only get.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
{{- end -}}

{{/* Labels that pick out the operator pods alone (PDB, NetworkPolicy, topology spread). */}}
{{- define "guardedcron.operatorSelectorLabels" -}}
{{ include "guardedcron.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end -}}
