{{/* The orchestrator's pods: KubeRay's Ray pods and the Deployment's. */}}

{{/* Init containers that fetch the tokenizer (object store, model image). */}}
{{- define "tandem.orchestratorInit" -}}
{{- if .Values.orchestrator.tokenizer.enabled }}
{{- include "tandem.modelInitContainers" (dict "root" . "model" (include "tandem.tokenizerModel" . | fromJson) "name" "tokenizer" "mount" "/models/tokenizer" "tokenizerOnly" true) }}
{{- end }}
{{- end }}

{{- /* What every Ray container of the cluster shares: tandem's image, environment and mounts. */}}
{{- define "tandem.rayContainer" -}}
image: {{ include "tandem.image" .root }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
env:
  {{- with (include "tandem.orchestratorEnv" .root | trim) }}{{ . | nindent 2 }}{{- end }}
  # What `tandem orchestrator` sets for a Ray it starts itself (tandem.orchestrator.app):
  # Serve's throughput-optimized mode and the ingress's message limits.
  - name: RAY_SERVE_THROUGHPUT_OPTIMIZED
    value: "1"
  - name: RAY_SERVE_ENABLE_DIRECT_INGRESS
    value: "0"
  - name: RAY_SERVE_PROXY_USE_GRPC
    value: "1"
  - name: RAY_SERVE_GRPC_MAX_MESSAGE_SIZE
    value: "4194304"
  - name: RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH
    value: "5242880"
resources:
  {{- toYaml .root.Values.orchestrator.resources | nindent 2 }}
securityContext:
  {{- with (include "tandem.securityContext" .root | trim) }}{{ . | nindent 2 }}{{- end }}
volumeMounts:
  {{- with (include "tandem.orchestratorMounts" .root | trim) }}{{ . | nindent 2 }}{{- end }}
{{- end }}
{{- define "tandem.rayPodSpec" -}}
serviceAccountName: {{ include "tandem.serviceAccountName" .root }}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.orchestrator.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
securityContext:
  {{- with (include "tandem.podSecurityContext" .root | trim) }}{{ . | nindent 2 }}{{- end }}
{{- with .root.Values.orchestrator.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.orchestrator.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.orchestrator.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $init := include "tandem.orchestratorInit" .root | trim }}
{{- if $init }}
initContainers:
  {{- $init | nindent 2 }}
{{- end }}
volumes:
  {{- with (include "tandem.orchestratorVolumes" .root | trim) }}{{ . | nindent 2 }}{{- end }}
{{- end }}
{{- define "tandem.rayPodMetadata" -}}
labels:
  {{- with (include "tandem.labels" (dict "root" .root "component" "orchestrator") | trim) }}{{ . | nindent 2 }}{{- end }}
  {{- with .root.Values.orchestrator.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/secrets: {{ include "tandem.secretsChecksum" .root }}
  {{- with (include "tandem.metricsAnnotations" (dict "root" .root "port" .root.Values.orchestrator.metricsPort) | trim) }}{{ . | nindent 2 }}{{- end }}
  {{- with .root.Values.orchestrator.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- define "tandem.rayPorts" -}}
- name: serve
  containerPort: {{ include "tandem.servePort" .root }}
  protocol: TCP
- name: serve-grpc
  containerPort: {{ .root.Values.orchestrator.grpcPort }}
  protocol: TCP
{{- if .root.Values.metrics.enabled }}
- name: tandem-metrics
  containerPort: {{ .root.Values.orchestrator.metricsPort }}
  protocol: TCP
{{- end }}
{{- end }}
