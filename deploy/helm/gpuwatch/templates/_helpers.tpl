{{/* Name of the chart, overridable. */}}
{{- define "gpuwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart unless the release name already holds the chart name. */}}
{{- define "gpuwatch.fullname" -}}
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

{{- define "gpuwatch.agentName" -}}
{{- printf "%s-agent" (include "gpuwatch.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "gpuwatch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpuwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuwatch
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gpuwatch.serverSelector" -}}
app.kubernetes.io/name: {{ include "gpuwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{- define "gpuwatch.querySelector" -}}
app.kubernetes.io/name: {{ include "gpuwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: query
{{- end }}

{{- define "gpuwatch.queryName" -}}
{{- printf "%s-query" (include "gpuwatch.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The object-store URL the query nodes read; fails the render without one. */}}
{{- define "gpuwatch.queryObjectStore" -}}
{{- if not .Values.server.objectStore.url }}
{{- fail "queryNodes.enabled needs server.objectStore.url (s3://bucket/prefix): query nodes read the tables from the object store; they cannot read the server's PersistentVolumeClaim" }}
{{- end }}
{{- .Values.server.objectStore.url }}
{{- end }}

{{/* Whether the server's ConfigMap and Secrets are rendered: for the server or the query nodes. */}}
{{- define "gpuwatch.serverShared" -}}
{{- if or .Values.server.enabled .Values.queryNodes.enabled }}true{{ end }}
{{- end }}

{{- define "gpuwatch.agentSelector" -}}
app.kubernetes.io/name: {{ include "gpuwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "gpuwatch.serverImage" -}}
{{- printf "%s:%s" .Values.server.image.repository (default .Chart.AppVersion .Values.server.image.tag) }}
{{- end }}

{{- define "gpuwatch.agentImage" -}}
{{- printf "%s:%s" .Values.agent.image.repository (default .Chart.AppVersion .Values.agent.image.tag) }}
{{- end }}

{{/* Secret holding tokens.toml. */}}
{{- define "gpuwatch.tokensSecret" -}}
{{- default (printf "%s-tokens" (include "gpuwatch.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* Secret holding the AWS_* variables of the object store. */}}
{{- define "gpuwatch.objectStoreSecret" -}}
{{- default (printf "%s-object-store" (include "gpuwatch.fullname" .)) .Values.server.objectStore.existingSecret }}
{{- end }}

{{/* Rules files the server loads, as mounted paths. */}}
{{- define "gpuwatch.rulesPaths" -}}
{{- $paths := list }}
{{- if .Values.rules.builtin }}
{{- range $path, $_ := .Files.Glob "files/rules/*.yaml" }}
{{- $paths = append $paths (printf "/etc/gpuwatch/rules/builtin/%s" (base $path)) }}
{{- end }}
{{- end }}
{{- range $name, $_ := .Values.rules.extra }}
{{- $paths = append $paths (printf "/etc/gpuwatch/rules/extra/%s" $name) }}
{{- end }}
{{- join "," $paths }}
{{- end }}

{{/* The agents' OTLP endpoint. */}}
{{- define "gpuwatch.agentEndpoint" -}}
{{- if .Values.agent.endpoint }}
{{- .Values.agent.endpoint }}
{{- else if eq .Values.agent.protocol "grpc" }}
{{- printf "http://%s.%s.svc:%v" (include "gpuwatch.fullname" .) .Release.Namespace .Values.server.service.ports.otlpGrpc }}
{{- else }}
{{- printf "http://%s.%s.svc:%v" (include "gpuwatch.fullname" .) .Release.Namespace .Values.server.service.ports.otlpHttp }}
{{- end }}
{{- end }}

{{/* Whether the agents send a bearer token: while auth is on. "true" or "". */}}
{{- define "gpuwatch.agentToken" -}}
{{- if .Values.auth.enabled }}
{{- if not (or .Values.server.enabled .Values.auth.existingSecret .Values.agent.authToken.existingSecret) }}
{{- fail "agent: with auth.enabled and server.enabled=false, give agent.authToken.existingSecret (a Secret holding the agents' ingest token) or set auth.enabled=false" }}
{{- end }}
{{- print "true" }}
{{- end }}
{{- end }}

{{/* Secret holding the agents' token (key agent.authToken.key). */}}
{{- define "gpuwatch.agentTokenSecret" -}}
{{- default (include "gpuwatch.tokensSecret" .) .Values.agent.authToken.existingSecret }}
{{- end }}
