{{/* Pieces of the NetworkPolicies. */}}

{{/* The pods of a component: (dict "root" $ "component" "drafter") */}}
{{- define "tandem.peer" -}}
- podSelector:
    matchLabels:
      {{- with (include "tandem.selectorLabels" . | trim) }}{{ . | nindent 6 }}{{- end }}
{{- end }}
{{- /* Where the tracing spans go: the built-in Jaeger, or any address on the collector's port. */}}
{{- define "tandem.otlpEgress" -}}
{{- if .Values.tracing.enabled }}
{{- if .Values.tracing.endpoint }}
{{- $hostport := (urlParse .Values.tracing.endpoint).host }}
- ports:
    - port: {{ ternary (regexReplaceAll ".*:" $hostport "") "4317" (contains ":" $hostport) | int }}
      protocol: TCP
{{- else }}
- to:
    {{- with (include "tandem.peer" (dict "root" . "component" "jaeger") | trim) }}{{ . | nindent 4 }}{{- end }}
  ports:
    - port: 4317
      protocol: TCP
{{- end }}
{{- end }}
{{- end }}
{{- define "tandem.objectStoreEgress" -}}
- to:
    {{- toYaml .Values.networkPolicy.objectStore | nindent 4 }}
  ports:
    - port: 443
      protocol: TCP
{{- end }}
{{- define "tandem.metricsIngress" -}}
{{- if .root.Values.metrics.enabled }}
- from:
    {{- toYaml .root.Values.networkPolicy.metricsScrapers | nindent 4 }}
  ports:
    - port: {{ .port }}
      protocol: TCP
{{- end }}
{{- end }}
