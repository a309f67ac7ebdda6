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
{{- else if hasKey $rules.awsOnly $name -}}
{{- $rule := get $rules.awsOnly $name -}}
{{- if and (not $rule.any) (not (has $v $rule.accept)) -}}
{{- fail (printf "env.%s=%q is not supported by vpcip (%s); accepted: %s" $name $v $rule.why (join ", " ($rule.accept | compact | default (list "")))) -}}
{{- end -}}
{{- else -}}
{{- fail (printf "env.%s is not a setting vpcip reads (a misspelling?); the names are listed in charts/vpcip/files/env.yaml; put other variables in extraEnv" $name) -}}
{{- end -}}
{{- end -}}
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

{{/* vpcip.env is the container env: the node name, the chart's paths, env, extraEnv. */}}
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
{{- range $name, $value := .Values.env }}
{{- if and (or (has $name $rules.supported) (has $name $rules.sdk)) (not (kindIs "invalid" $value)) }}
- name: {{ $name }}
  value: {{ toString $value | quote }}
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}
