{{/*
vpcip.checkEnv fails the render on an env key the chart cannot pass on
unchanged (files/env.yaml explains the rules) and returns nothing.
*/}}
{{- define "vpcip.checkEnv" -}}
{{- $rules := .Files.Get "files/env.yaml" | fromYaml -}}
{{- range $name, $value := .Values.env -}}
{{- $v := toString $value -}}
{{- if kindIs "invalid" $value -}}{{- $v = "" -}}{{- end -}}
{{- if or (has $name $rules.supported) (has $name $rules.sdk) -}}
{{- if hasKey $rules.chartOwned $name -}}
{{- fail (printf "env.%s: %s; remove it from env" $name (get $rules.chartOwned $name)) -}}
{{- end -}}
{{- if and (eq $name "AWS_VPC_K8S_CNI_LOG_FILE") (not (has $v (list "" "stdout" "stderr"))) (not (hasPrefix "/host/var/log/aws-routed-eni/" $v)) (not (hasPrefix "/var/log/vpcip/" $v)) -}}
{{- fail (printf "env.AWS_VPC_K8S_CNI_LOG_FILE=%q: vpcipd's container sees the host's log directories at /host/var/log/aws-routed-eni/ and /var/log/vpcip/ only; put the file under one of them (or use stdout or stderr)" $v) -}}
{{- end -}}
{{- if and (eq $name "VPCIP_GC_GRACE") (ne $v "") -}}
{{- $secs := include "vpcip.seconds" $v -}}
{{- if or (eq $secs "invalid") (lt (float64 $secs) 10.0) -}}
{{- fail (printf "env.VPCIP_GC_GRACE=%q: want a duration like 30s or 2m, at least 10s: a CNI GC's list of valid attachments can predate an ADD in flight, and a shorter grace lets that GC remove the new pod's veth and release its address (vpcipd refuses to start with it)" $v) -}}
{{- end -}}
{{- end -}}
{{- if and (has $name (list "ENABLE_IPv6" "ENABLE_IPv4" "ENABLE_PREFIX_DELEGATION" "ENABLE_V4_EGRESS")) (not (has $v (list "" "true" "false"))) -}}
{{- fail (printf "env.%s=%q: want \"true\" or \"false\"" $name $v) -}}
{{- end -}}
{{- if and (eq $name "AWS_VPC_K8S_PLUGIN_LOG_FILE") (eq $v "stdout") -}}
{{- fail "env.AWS_VPC_K8S_PLUGIN_LOG_FILE=\"stdout\": the plugin's stdout carries its CNI result; use stderr or a host path" -}}
{{- end -}}
{{- else if hasKey $rules.awsOnly $name -}}
{{- $rule := get $rules.awsOnly $name -}}
{{- if $rule.sameAs -}}
{{- $other := get $.Values.env $rule.sameAs | default $rule.default | toString -}}
{{- if not (has $v (list "" $other)) -}}
{{- fail (printf "env.%s=%q is not supported by vpcip (%s); accepted: unset or %q, the value of %s" $name $v $rule.why $other $rule.sameAs) -}}
{{- end -}}
{{- else if and (not $rule.any) (not (has $v $rule.accept)) -}}
{{- fail (printf "env.%s=%q is not supported by vpcip (%s); accepted: %s" $name $v $rule.why (join ", " ($rule.accept | compact | default (list "")))) -}}
{{- end -}}
{{- else if hasKey $rules.mapped $name -}}
{{- $extra := list -}}
{{- range $.Values.extraEnv -}}{{- $extra = append $extra .name -}}{{- end -}}
{{- range (get $rules.mapped $name).to -}}
{{- $to := . -}}
{{- if or (hasKey $.Values.env $to) (has $to $extra) -}}
{{- fail (printf "env.%s and %s both set: %s is passed on as %s; set one of them" $name $to $name $to) -}}
{{- end -}}
{{- end -}}
{{- if and (eq $name "CLUSTER_ENDPOINT") (ne $v "") -}}
{{- $u := urlParse $v -}}
{{- if or (ne $u.scheme "https") (eq $u.hostname "") -}}
{{- fail (printf "env.CLUSTER_ENDPOINT=%q: want the API server's https URL, such as https://ABCD.gr7.us-west-2.eks.amazonaws.com" $v) -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- fail (printf "env.%s is not a setting vpcip reads (a misspelling?); the names are listed in charts/vpcip/files/env.yaml; put other variables in extraEnv" $name) -}}
{{- end -}}
{{- end -}}
{{- include "vpcip.checkFamily" . -}}
{{- end -}}

{{/*
vpcip.checkFamily fails the render unless env asks for one of the two modes
vpcipd runs (ipamd/config's rule, the reference's): IPv4 (ENABLE_IPv6 unset
or "false", ENABLE_IPv4 unset or "true"), or IPv6 (ENABLE_IPv6="true" with
ENABLE_IPv4="false" and ENABLE_PREFIX_DELEGATION="true"). Dual stack is
not supported.
*/}}
{{- define "vpcip.checkFamily" -}}
{{- $v6 := include "vpcip.envBool" (list .Values.env "ENABLE_IPv6" "false") -}}
{{- $v4 := include "vpcip.envBool" (list .Values.env "ENABLE_IPv4" "true") -}}
{{- $pd := include "vpcip.envBool" (list .Values.env "ENABLE_PREFIX_DELEGATION" "false") -}}
{{- $six := "set ENABLE_IPv6=\"true\", ENABLE_IPv4=\"false\" and ENABLE_PREFIX_DELEGATION=\"true\"" -}}
{{- if and (eq $v6 "true") (eq $v4 "true") -}}
{{- fail (printf "env.ENABLE_IPv6=\"true\" with ENABLE_IPv4=\"true\" (its default): dual stack is not supported; for IPv6 pods %s" $six) -}}
{{- else if and (eq $v6 "true") (ne $pd "true") -}}
{{- fail (printf "env.ENABLE_IPv6=\"true\" with ENABLE_PREFIX_DELEGATION=%q: IPv6 pods take their addresses from a /80 prefix on the primary ENI; %s" $pd $six) -}}
{{- else if and (ne $v6 "true") (ne $v4 "true") -}}
{{- fail (printf "env.ENABLE_IPv4=%q without ENABLE_IPv6=\"true\": pods need one address family; for IPv6 pods %s" $v4 $six) -}}
{{- end -}}
{{- end -}}

{{/* vpcip.envBool is (list env NAME default): env's NAME as a string ("true", "false"), or default when unset, null or "". */}}
{{- define "vpcip.envBool" -}}
{{- $v := get (index . 0) (index . 1) -}}
{{- if or (kindIs "invalid" $v) (eq (toString $v) "") -}}{{ index . 2 }}{{- else -}}{{ toString $v }}{{- end -}}
{{- end -}}

{{/* vpcip.envAccepted lists "NAME=value: why" for accepted awsOnly keys (NOTES.txt). */}}
{{- define "vpcip.envAccepted" -}}
{{- $rules := .Files.Get "files/env.yaml" | fromYaml -}}
{{- range $name, $value := .Values.env -}}
{{- if hasKey $rules.awsOnly $name }}
  {{ $name }}={{ toString $value }}: {{ (get $rules.awsOnly $name).why }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* vpcip.env is the container env: the node name, the chart's paths, env (mapped names passed on as files/env.yaml says), extraEnv. */}}
{{- define "vpcip.env" -}}
{{- $rules := .Files.Get "files/env.yaml" | fromYaml -}}
- name: MY_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: VPCIP_SOCKET
  value: /run/vpcip/ipamd.sock
- name: VPCIP_CHECKPOINT
  value: /var/run/vpcip/ipam.json
- name: VPCIP_CNI_BIN_DIR
  value: /host/opt/cni/bin
- name: VPCIP_CNI_CONF_DIR
  value: /host/etc/cni/net.d
{{- $skip := list -}}
{{- if .Values.metrics.bindNodeAddress }}{{- $skip = list "VPCIP_METRICS_ADDR" "METRICS_BIND_ADDRESS" }}{{- end }}
{{- range $name, $value := .Values.env }}
{{- if and (or (has $name $rules.supported) (has $name $rules.sdk)) (not (kindIs "invalid" $value)) (not (has $name $skip)) }}
- name: {{ $name }}
  value: {{ toString $value | quote }}
{{- end }}
{{- end }}
{{- with get .Values.env "AWS_EC2_ENDPOINT" | default "" | toString }}
- name: AWS_ENDPOINT_URL_EC2
  value: {{ . | quote }}
{{- end }}
{{- with get .Values.env "CLUSTER_ENDPOINT" | default "" | toString }}
{{- $u := urlParse . }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ $u.hostname | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ regexFind ":[0-9]+$" $u.host | trimPrefix ":" | default "443" | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
vpcip.seconds is a Go duration string (time.ParseDuration's form: "0", or
numbers with units ns, us, µs, ms, s, m, h, such as 1m30s) in seconds, or
"invalid".
*/}}
{{- define "vpcip.seconds" -}}
{{- $v := toString . -}}
{{- $part := "([0-9]+\\.?[0-9]*|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)" -}}
{{- if eq $v "0" -}}0
{{- else if not (regexMatch (printf "^(%s)+$" $part) $v) -}}invalid
{{- else -}}
{{- $unit := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "μs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll $part $v -1 -}}
{{- $num := regexFind "^([0-9]+\\.?[0-9]*|\\.[0-9]+)" . -}}
{{- $total = addf $total (mulf (float64 $num) (get $unit (trimPrefix $num .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}
{{- end -}}

{{/*
vpcip.metricsEnv is the vpcipd container's metrics settings from values
metrics: with bindNodeAddress, HOST_IP (the pod's status.hostIP: the node's
primary address, as the pod uses the host network) and VPCIP_METRICS_ADDR
$(HOST_IP):<port>; with secure, VPCIP_METRICS_SECURE and, with a
tlsSecretName, VPCIP_METRICS_TLS_DIR where that Secret is mounted.
*/}}
{{- define "vpcip.metricsEnv" -}}
{{- $port := include "vpcip.metricsPort" . -}}
{{- if and .Values.metrics.bindNodeAddress $port }}
- name: HOST_IP
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
- name: VPCIP_METRICS_ADDR
  value: {{ printf "$(HOST_IP):%s" $port | quote }}
{{- end }}
{{- if .Values.metrics.secure }}
- name: VPCIP_METRICS_SECURE
  value: "true"
{{- if .Values.metrics.tlsSecretName }}
- name: VPCIP_METRICS_TLS_DIR
  value: /etc/vpcip/metrics-tls
{{- end }}
{{- end }}
{{- end -}}
