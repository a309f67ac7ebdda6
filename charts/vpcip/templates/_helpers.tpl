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
app.kubernetes.io/managed-by: Helm
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

{{/* The metrics listen address as env sets it (default ":61678"), or "off". */}}
{{- define "vpcip.metricsAddr" -}}
{{- coalesce (get .Values.env "VPCIP_METRICS_ADDR") (get .Values.env "METRICS_BIND_ADDRESS") ":61678" | toString -}}
{{- end -}}

{{/* The metrics port, or "" when metrics are off. */}}
{{- define "vpcip.metricsPort" -}}
{{- $addr := include "vpcip.metricsAddr" . -}}
{{- if ne $addr "off" -}}
{{- include "vpcip.listen" (list $addr) | splitList " " | last -}}
{{- end -}}
{{- end -}}

{{/*
vpcip.checkMetrics fails the render on values metrics that cannot work
together with env, and returns nothing.
*/}}
{{- define "vpcip.checkMetrics" -}}
{{- $addr := include "vpcip.metricsAddr" . -}}
{{- $m := .Values.metrics -}}
{{- if and (or $m.bindNodeAddress $m.secure) (eq $addr "off") -}}
{{- fail (printf "metrics.bindNodeAddress and metrics.secure need the daemon's metrics, but env.VPCIP_METRICS_ADDR is off; turn them off or give VPCIP_METRICS_ADDR a port") -}}
{{- end -}}
{{- if $m.bindNodeAddress -}}
{{- $host := trimSuffix (printf ":%s" (regexFind "[0-9]+$" $addr)) $addr | trimPrefix "[" | trimSuffix "]" -}}
{{- if not (has $host (list "" "0.0.0.0" "::")) -}}
{{- fail (printf "metrics.bindNodeAddress: env.VPCIP_METRICS_ADDR=%q names an address; the chart binds the node's primary address itself, so give only the port (\":61678\") or turn bindNodeAddress off" $addr) -}}
{{- end -}}
{{- end -}}
{{- if and $m.tlsSecretName (not $m.secure) -}}
{{- fail "metrics.tlsSecretName is used only with metrics.secure: true (the plain listener serves no TLS); set secure or remove tlsSecretName" -}}
{{- end -}}
{{- if and $m.secure (or .Values.podMonitor.enabled .Values.podMonitor.create .Values.serviceMonitor.enabled) (not $m.scrapeTokenSecret.name) -}}
{{- if not .Values.rbac.create -}}
{{- fail "metrics.secure with a PodMonitor or ServiceMonitor and rbac.create: false: the chart cannot bind its own scraper to the metrics reader role; name a Secret holding an authorized token in metrics.scrapeTokenSecret.name" -}}
{{- end -}}
{{- if and (or .Values.podMonitor.enabled .Values.podMonitor.create) .Values.podMonitor.namespace (ne .Values.podMonitor.namespace .Release.Namespace) -}}
{{- fail (printf "metrics.secure with podMonitor.namespace %q: the PodMonitor's token Secret must be in its own namespace, and the chart makes its scraper's in %q; name a Secret of %q in metrics.scrapeTokenSecret.name" .Values.podMonitor.namespace .Release.Namespace .Values.podMonitor.namespace) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* vpcip.scrapeTokenSecret is the name of the Secret whose token the monitors send (metrics.secure). */}}
{{- define "vpcip.scrapeTokenSecret" -}}
{{- .Values.metrics.scrapeTokenSecret.name | default (printf "%s-metrics-scraper-token" (include "vpcip.fullname" .)) -}}
{{- end -}}

{{/* vpcip.scrapeSecurity is a monitor endpoint's https scheme, TLS settings and bearer token when metrics.secure is on. */}}
{{- define "vpcip.scrapeSecurity" -}}
{{- if .Values.metrics.secure -}}
scheme: https
tlsConfig:
  {{- toYaml .Values.metrics.scrapeTLSConfig | nindent 2 }}
authorization:
  type: Bearer
  credentials:
    name: {{ include "vpcip.scrapeTokenSecret" . }}
    key: {{ .Values.metrics.scrapeTokenSecret.key | default "token" }}
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
