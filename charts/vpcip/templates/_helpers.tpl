{{/* Names and labels. */}}
{{- define "vpcip.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vpcip.fullname" -}}
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

{{- define "vpcip.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vpcip.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vpcip.labels" -}}
{{ include "vpcip.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "vpcip.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "vpcip.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
vpcip.image is image.override when set (the AWS VPC CNI chart's whole
reference), else the repository (image.overrideRepository wins) by digest or
tag.
*/}}
{{- define "vpcip.image" -}}
{{- $repo := .Values.image.overrideRepository | default .Values.image.repository -}}
{{- if .Values.image.override -}}
{{- .Values.image.override -}}
{{- else if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* vpcip.probe is a probe's timings: values.<name>, its timeoutSeconds replaced by <name>TimeoutSeconds when set. */}}
{{- define "vpcip.probe" -}}
{{- $root := index . 0 -}}{{- $name := index . 1 -}}
{{- $p := deepCopy (get $root.Values $name) -}}
{{- with get $root.Values (printf "%sTimeoutSeconds" $name) -}}{{- $_ := set $p "timeoutSeconds" . -}}{{- end -}}
{{- toYaml $p -}}
{{- end -}}

{{/*
vpcip.listen returns "host port" of a listen address setting (host:port,
:port, [v6]:port); host is the loopback address when the setting listens on
every address. The daemon's own default is passed as the second element.
*/}}
{{- define "vpcip.listen" -}}
{{- $addr := index . 0 -}}
{{- $port := regexFind "[0-9]+$" $addr -}}
{{- $host := trimSuffix (printf ":%s" $port) $addr | trimPrefix "[" | trimSuffix "]" -}}
{{- if or (eq $host "") (eq $host "0.0.0.0") (eq $host "::") -}}{{- $host = "127.0.0.1" -}}{{- end -}}
{{- printf "%s %s" $host $port -}}
{{- end -}}

{{/* The introspection address ("host port") the probes read. */}}
{{- define "vpcip.introspection" -}}
{{- $addr := coalesce (get .Values.env "VPCIP_INTROSPECTION_ADDR") (get .Values.env "INTROSPECTION_BIND_ADDRESS") "127.0.0.1:61679" | toString -}}
{{- if eq $addr "off" -}}
{{- fail "env.VPCIP_INTROSPECTION_ADDR=off: the chart's liveness and readiness probes read the introspection endpoint; keep it on (it listens on loopback by default)" -}}
{{- end -}}
{{- include "vpcip.listen" (list $addr) -}}
{{- end -}}

{{/* The metrics port, or "" when metrics are off. */}}
{{- define "vpcip.metricsPort" -}}
{{- $addr := coalesce (get .Values.env "VPCIP_METRICS_ADDR") (get .Values.env "METRICS_BIND_ADDRESS") ":61678" | toString -}}
{{- if ne $addr "off" -}}
{{- include "vpcip.listen" (list $addr) | splitList " " | last -}}
{{- end -}}
{{- end -}}

{{/*
vpcip.clusterRoleRules is the rules list of files/clusterrole-rules.yaml,
which holds either a bare list of PolicyRules or an object with `rules:`.
*/}}
{{- define "vpcip.clusterRoleRules" -}}
{{- $raw := .Files.Get "files/clusterrole-rules.yaml" -}}
{{- $list := fromYamlArray $raw -}}
{{- if and (eq (len $list) 1) (kindIs "string" (first $list)) -}}
{{- $list = (fromYaml $raw).rules | default list -}}
{{- end -}}
{{- toYaml $list -}}
{{- end -}}
