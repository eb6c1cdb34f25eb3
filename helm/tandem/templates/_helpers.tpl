{{/* Names, labels and the pieces every pod shares. */}}

{{- define "tandem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name, at most 34 characters: "<fullname>-orchestrator" names the RayService,
     which KubeRay allows 47 characters (and the longest component name stays under 63). */}}
{{- define "tandem.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 34 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 34 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 34 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tandem.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of a component: (dict "root" $ "component" "drafter") */}}
{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tandem.labels" -}}
helm.sh/chart: {{ include "tandem.chart" .root }}
{{ include "tandem.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: tandem
{{- end }}

{{/* The release's pods, whatever their component (the default-deny NetworkPolicy). */}}
{{- define "tandem.instanceLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tandem.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "tandem.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tandem.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* drafter.kind head: the target verifiers draft inside themselves with an EAGLE-3 head
     (`tandem worker target --head`); there is no drafter pool. "true" or empty. */}}
{{- define "tandem.headDrafter" -}}
{{- if eq (.Values.drafter.kind | default "model") "head" }}true{{ end }}
{{- end }}

{{/* The worker pools the release runs, as a JSON list: the verifiers, and the drafters unless
     the verifiers draft themselves (drafter.kind head). */}}
{{- define "tandem.pools" -}}
{{- if include "tandem.headDrafter" . }}{{ list "verifier" | toJson }}{{ else }}{{ list "drafter" "verifier" | toJson }}{{ end }}
{{- end }}

{{/* Service names. */}}
{{- define "tandem.drafterService" -}}{{ include "tandem.fullname" . }}-drafter{{- end }}
{{- define "tandem.verifierService" -}}{{ include "tandem.fullname" . }}-verifier{{- end }}
{{- define "tandem.orchestratorService" -}}{{ include "tandem.fullname" . }}-orchestrator{{- end }}
{{- define "tandem.redisService" -}}{{ include "tandem.fullname" . }}-redis{{- end }}
{{- define "tandem.jaegerService" -}}{{ include "tandem.fullname" . }}-jaeger{{- end }}

{{/* A Service's fully qualified DNS name: (dict "root" $ "name" "x") */}}
{{- define "tandem.fqdn" -}}
{{- printf "%s.%s.svc.%s" .name .root.Release.Namespace .root.Values.clusterDomain }}
{{- end }}

{{/* The pools as the orchestrator dials them: a headless Service resolves to every ready worker. */}}
{{- define "tandem.drafterAddress" -}}
{{- printf "%s:%d" (include "tandem.fqdn" (dict "root" . "name" (include "tandem.drafterService" .))) (int .Values.drafter.port) }}
{{- end }}
{{- define "tandem.verifierAddress" -}}
{{- printf "%s:%d" (include "tandem.fqdn" (dict "root" . "name" (include "tandem.verifierService" .))) (int .Values.verifier.port) }}
{{- end }}

{{/* Secret names and keys. */}}
{{- define "tandem.apiKeySecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-api-key" (include "tandem.fullname" .)) }}
{{- end }}
{{- define "tandem.apiKeySecretKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.existingSecretKey }}{{ else }}api-key{{ end }}
{{- end }}
{{- define "tandem.redisSecret" -}}
{{- .Values.redis.existingSecret | default (printf "%s-redis" (include "tandem.fullname" .)) }}
{{- end }}
{{- define "tandem.redisSecretKey" -}}
{{- if .Values.redis.existingSecret }}{{ .Values.redis.existingSecretKey }}{{ else }}password{{ end }}
{{- end }}
{{- define "tandem.workerTLSSecret" -}}
{{- if .Values.tls.certManager.enabled }}{{ include "tandem.fullname" . }}-worker-tls{{ else }}{{ .Values.tls.workerSecret }}{{ end }}
{{- end }}
{{- define "tandem.orchestratorTLSSecret" -}}
{{- if .Values.tls.certManager.enabled }}{{ include "tandem.fullname" . }}-orchestrator-tls{{ else }}{{ .Values.tls.orchestratorSecret }}{{ end }}
{{- end }}

{{/* A secret value that survives upgrades: the given one, else the one in the cluster, else a new
     random one, made once per render (the Secret and the pods' checksums see the same value).
     (dict "root" $ "name" secretName "key" key "value" given) → base64 */}}
{{- define "tandem.persistentSecretValue" -}}
{{- $cache := .root.Values.__generatedSecrets | default dict }}
{{- $_ := set .root.Values "__generatedSecrets" $cache }}
{{- $id := printf "%s/%s" .name .key }}
{{- if not (hasKey $cache $id) }}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .name }}
{{- if .value }}
{{- $_ := set $cache $id (.value | b64enc) }}
{{- else if and $existing (index ($existing.data | default dict) .key) }}
{{- $_ := set $cache $id (index $existing.data .key) }}
{{- else }}
{{- $_ := set $cache $id (randAlphaNum 40 | b64enc) }}
{{- end }}
{{- end }}
{{- index $cache $id }}
{{- end }}

{{/* A checksum of the secret values the chart makes (not of their manifests): pods restart when
     a value changes, and only then. */}}
{{- define "tandem.secretsChecksum" -}}
{{- $values := list }}
{{- if and .Values.auth.enabled (not .Values.auth.existingSecret) }}
{{- $values = append $values (include "tandem.persistentSecretValue" (dict "root" . "name" (include "tandem.apiKeySecret" .) "key" "api-key" "value" .Values.auth.apiKey)) }}
{{- end }}
{{- if and (eq .Values.redis.mode "builtin") (not .Values.redis.existingSecret) }}
{{- $values = append $values (include "tandem.persistentSecretValue" (dict "root" . "name" (include "tandem.redisSecret" .) "key" "password" "value" "")) }}
{{- end }}
{{- join "," $values | sha256sum }}
{{- end }}

{{/* The pod's security context (restricted Pod Security Standard). */}}
{{- define "tandem.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end }}
{{- define "tandem.securityContext" -}}
{{- toYaml .Values.securityContext }}
{{- end }}

{{/* Checks the values cannot express in the schema; each failure names the value to fix. */}}
{{- define "tandem.validate" -}}
{{- $verifierKind := .Values.verifier.kind | default "model" }}
{{- if include "tandem.headDrafter" . }}
{{- if ne $verifierKind "model" }}
{{- fail (printf "drafter.kind is head: the head drafts inside the target verifier (`tandem worker target --head`), but verifier.kind is %s; leave verifier.kind unset (model)" $verifierKind) }}
{{- end }}
{{- $h := .Values.drafter.head | default dict }}
{{- if or (not $h.source) (and (eq $h.source "image") (not ($h.image | default dict).path)) }}
{{- fail "drafter.kind is head: give drafter.head, the EAGLE-3 head's directory (drafter.head.image.path in an image, or a pvc or objectStore source, as for drafter.model)" }}
{{- end }}
{{- else if eq $verifierKind "head" }}
{{- fail "verifier.kind is head: set drafter.kind=head instead (the verifiers then draft with the EAGLE-3 head drafter.head)" }}
{{- end }}
{{- if .Values.verifier.head }}
{{- fail "verifier.head is not a value: the head is drafter.head (with drafter.kind=head, the verifiers load it)" }}
{{- end }}
{{- range $pool := include "tandem.pools" . | fromJsonArray }}
{{- $v := index $.Values $pool }}
{{- if and (eq $pool "verifier") (ne ($v.kind | default "model") "model") }}
{{- fail (printf "verifier.kind is %s: only the drafter pool can draft by n-gram lookup; the verifier needs the target model" $v.kind) }}
{{- end }}
{{- if and (hasPrefix "cuda" $v.device) (lt (int $v.gpu.count) 1) }}
{{- fail (printf "%s.device is %s but %s.gpu.count is 0: the pods would get no GPU" $pool $v.device $pool) }}
{{- end }}
{{- if and (gt (int $v.gpu.count) 0) (not (hasPrefix "cuda" $v.device)) }}
{{- fail (printf "%s.gpu.count is %d but %s.device is %s: set device to cuda (or the GPUs stay idle)" $pool (int $v.gpu.count) $pool $v.device) }}
{{- end }}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- fail (printf "%s.autoscaling: minReplicas (%d) is above maxReplicas (%d)" $pool (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- end }}
{{- if and $v.autoscaling.enabled (not $v.autoscaling.targetCPUUtilizationPercentage) (not $v.autoscaling.metrics) }}
{{- fail (printf "%s.autoscaling: give targetCPUUtilizationPercentage or metrics" $pool) }}
{{- end }}
{{- if eq (int $v.port) (int $v.metricsPort) }}
{{- fail (printf "%s.port and %s.metricsPort are both %d" $pool $pool (int $v.port)) }}
{{- end }}
{{- end }}
{{- $o := .Values.orchestrator }}
{{- if eq (int $o.grpcPort) (int $o.metricsPort) }}
{{- fail (printf "orchestrator.grpcPort and orchestrator.metricsPort are both %d" (int $o.grpcPort)) }}
{{- end }}
{{- range $other := list "grpcPort" "metricsPort" }}
{{- if and (ne (int $o.httpPort) 0) (eq (int $o.httpPort) (int (index $o $other))) }}
{{- fail (printf "orchestrator.httpPort and orchestrator.%s are both %d" $other (int $o.httpPort)) }}
{{- end }}
{{- end }}
{{- if eq $o.kind "RayService" }}
{{- if has (int $o.metricsPort) (list 6379 8080 8265 10001 52365 (int (include "tandem.servePort" .))) }}
{{- fail (printf "orchestrator.metricsPort %d is a port Ray uses under KubeRay" (int $o.metricsPort)) }}
{{- end }}
{{- if has (int $o.httpPort) (list 6379 8080 8265 10001 52365) }}
{{- fail (printf "orchestrator.httpPort %d is a port Ray uses under KubeRay" (int $o.httpPort)) }}
{{- end }}
{{- end }}
{{- if eq .Values.redis.mode "external" }}
{{- $e := .Values.redis.external }}
{{- if and (not $e.url) (not (and $e.existingSecret $e.urlKey)) }}
{{- fail "redis.mode is external: give redis.external.url, or redis.external.existingSecret and redis.external.urlKey" }}
{{- end }}
{{- if and $e.url $e.urlKey }}
{{- fail "redis.external: give url or urlKey, not both" }}
{{- end }}
{{- if and $e.caSecret $e.url (not (hasPrefix "rediss://" $e.url)) }}
{{- fail "redis.external.caSecret needs a rediss:// url" }}
{{- end }}
{{- end }}
{{- if and .Values.tracing.enabled (not .Values.tracing.endpoint) (not .Values.tracing.jaeger.enabled) }}
{{- fail "tracing.enabled: give tracing.endpoint (an OTLP/gRPC collector) or tracing.jaeger.enabled=true" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.certManager.enabled) (or (not .Values.tls.workerSecret) (not .Values.tls.orchestratorSecret)) }}
{{- fail "tls.enabled: give tls.workerSecret and tls.orchestratorSecret (kubernetes.io/tls Secrets with ca.crt), or tls.certManager.enabled=true" }}
{{- end }}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.enabled) }}
{{- fail "tls.certManager.enabled needs tls.enabled=true" }}
{{- end }}
{{- if and (eq .Values.orchestrator.kind "RayService") (not (regexMatch "^[a-z]" (include "tandem.fullname" .))) }}
{{- fail (printf "the RayService's name must start with a letter (KubeRay): %s-orchestrator; set fullnameOverride" (include "tandem.fullname" .)) }}
{{- end }}
{{- if and .Values.orchestrator.ingress.enabled (not .Values.orchestrator.ingress.host) }}
{{- fail "orchestrator.ingress.enabled: give orchestrator.ingress.host" }}
{{- end }}
{{- end }}

{{/* The standard OpenTelemetry variables (docs/observability.md) and the pod's identity. */}}
{{- define "tandem.otelEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- if .Values.tracing.enabled }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ include "tandem.otlpEndpoint" . | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: grpc
- name: OTEL_TRACES_SAMPLER
  value: {{ .Values.tracing.sampler | quote }}
{{- if hasSuffix "traceidratio" .Values.tracing.sampler }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .Values.tracing.ratio | toString | quote }}
{{- end }}
{{- $attributes := list "k8s.namespace.name=$(POD_NAMESPACE)" "k8s.pod.name=$(POD_NAME)" (printf "service.version=%s" .Chart.AppVersion) }}
{{- range $k, $v := .Values.tracing.resourceAttributes }}
{{- $attributes = append $attributes (printf "%s=%s" $k $v) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attributes | quote }}
{{- else }}
- name: OTEL_SDK_DISABLED
  value: "true"
{{- end }}
{{- end }}

{{- define "tandem.otlpEndpoint" -}}
{{- if .Values.tracing.endpoint }}
{{- .Values.tracing.endpoint }}
{{- else }}
{{- printf "http://%s:4317" (include "tandem.fqdn" (dict "root" . "name" (include "tandem.jaegerService" .))) }}
{{- end }}
{{- end }}

{{/* The orchestrator's Redis: REDIS_URL (read by `tandem orchestrator` and the Serve app), its password from a Secret. */}}
{{- define "tandem.redisEnv" -}}
{{- if eq .Values.redis.mode "builtin" }}
- name: TANDEM_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "tandem.redisSecret" . }}
      key: {{ include "tandem.redisSecretKey" . }}
- name: REDIS_URL
  value: {{ printf "redis://:$(TANDEM_REDIS_PASSWORD)@%s:6379/0" (include "tandem.fqdn" (dict "root" . "name" (include "tandem.redisService" .))) | quote }}
{{- else }}
{{- $e := .Values.redis.external }}
{{- if $e.urlKey }}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ $e.existingSecret }}
      key: {{ $e.urlKey }}
{{- else }}
{{- $url := $e.url }}
{{- if and $e.existingSecret $e.passwordKey }}
- name: TANDEM_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $e.existingSecret }}
      key: {{ $e.passwordKey }}
{{- $url = regexReplaceAll "^(rediss?://)" $url (printf "${1}%s:$(TANDEM_REDIS_PASSWORD)@" $e.username) }}
{{- end }}
{{- if $e.caSecret }}
{{- $url = printf "%s%sssl_ca_certs=/etc/tandem/redis-tls/%s" $url (ternary "&" "?" (contains "?" $url)) $e.caKey }}
{{- end }}
- name: REDIS_URL
  value: {{ $url | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The ingress token, read by `tandem orchestrator` and the Serve app (TANDEM_API_KEY). */}}
{{- define "tandem.apiKeyEnv" -}}
{{- if .Values.auth.enabled }}
- name: TANDEM_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "tandem.apiKeySecret" . }}
      key: {{ include "tandem.apiKeySecretKey" . }}
{{- end }}
{{- end }}

{{/* Prometheus annotations of a pod: (dict "root" $ "port" 9101) */}}
{{- define "tandem.metricsAnnotations" -}}
{{- if and .root.Values.metrics.enabled .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/* Default topology spread: over nodes and zones, as far as possible. (dict "root" $ "component" "drafter" "value" list) */}}
{{- define "tandem.topologySpread" -}}
{{- if .value }}
{{- toYaml .value }}
{{- else }}
{{- range $key := list "kubernetes.io/hostname" "topology.kubernetes.io/zone" }}
- maxSkew: 1
  topologyKey: {{ $key }}
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- with (include "tandem.selectorLabels" (dict "root" $.root "component" $.component) | trim) }}{{ . | nindent 6 }}{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* ---- Model sources ------------------------------------------------------------------------
     (dict "root" $ "model" <model values> "name" "model" "mount" "/models/model" "tokenizerOnly" false)
     A model is at modelPath; volumes and init containers put it there. */}}

{{- define "tandem.modelPath" -}}
{{- if and (eq .model.source "image") (not .model.image.repository) }}
{{- .model.image.path }}
{{- else }}
{{- .mount }}
{{- end }}
{{- end }}

{{- define "tandem.modelVolumes" -}}
{{- if eq .model.source "pvc" }}
- name: {{ .name }}
  persistentVolumeClaim:
    claimName: {{ .model.pvc.claimName }}
    readOnly: true
{{- else if eq .model.source "objectStore" }}
- name: {{ .name }}
  emptyDir:
    sizeLimit: {{ .model.objectStore.sizeLimit }}
{{- else if .model.image.repository }}
- name: {{ .name }}
  emptyDir: {}
{{- end }}
{{- end }}

{{- define "tandem.modelMounts" -}}
{{- if eq .model.source "pvc" }}
- name: {{ .name }}
  mountPath: {{ .mount }}
  readOnly: true
  {{- if .model.pvc.subPath }}
  subPath: {{ .model.pvc.subPath }}
  {{- end }}
{{- else if or (eq .model.source "objectStore") .model.image.repository }}
- name: {{ .name }}
  mountPath: {{ .mount }}
  readOnly: true
{{- end }}
{{- end }}

{{/* The files a tokenizer needs (copied instead of the whole model for the orchestrator). */}}
{{- define "tandem.tokenizerFiles" -}}
{{- list "tokenizer*" "*.json" "*.model" "*.txt" "*.tiktoken" | toJson }}
{{- end }}

{{- define "tandem.modelInitContainers" -}}
{{- $root := .root }}
{{- if eq .model.source "objectStore" }}
{{- $url := .model.objectStore.url }}
{{- $remote := regexReplaceAll "^s3://" (regexReplaceAll "^gs://" $url ":gcs:") ":s3:" }}
- name: fetch-{{ .name }}
  image: {{ printf "%s:%s" $root.Values.modelDownloader.image.repository $root.Values.modelDownloader.image.tag }}
  imagePullPolicy: {{ $root.Values.modelDownloader.image.pullPolicy }}
  command: [rclone]
  args:
    - copy
    - {{ $remote | quote }}
    - {{ .mount | quote }}
    {{- if hasPrefix "s3://" $url }}
    - --s3-provider=AWS
    - --s3-env-auth
    {{- else }}
    - --gcs-env-auth
    {{- end }}
    - --transfers=8
    {{- if .tokenizerOnly }}
    {{- range (include "tandem.tokenizerFiles" .) | fromJsonArray }}
    - --include={{ . }}
    {{- end }}
    {{- end }}
    {{- range .model.objectStore.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - name: HOME
      value: /tmp
    - name: RCLONE_CONFIG
      value: /tmp/rclone.conf
  {{- if .model.objectStore.secretName }}
  envFrom:
    - secretRef:
        name: {{ .model.objectStore.secretName }}
  {{- end }}
  securityContext:
    {{- with (include "tandem.securityContext" $root | trim) }}{{ . | nindent 4 }}{{- end }}
  resources:
    {{- toYaml $root.Values.modelDownloader.resources | nindent 4 }}
  volumeMounts:
    - name: {{ .name }}
      mountPath: {{ .mount }}
    - name: tmp
      mountPath: /tmp
{{- else if and (eq .model.source "image") .model.image.repository }}
- name: copy-{{ .name }}
  image: {{ printf "%s:%s" .model.image.repository (.model.image.tag | default "latest") }}
  imagePullPolicy: {{ .model.image.pullPolicy }}
  {{- if .tokenizerOnly }}
  command: [sh, -c]
  args:
    - {{ printf "cd %s && cp -a %s %s/ 2>/dev/null; ls %s/tokenizer* >/dev/null" .model.image.path (join " " ((include "tandem.tokenizerFiles" .) | fromJsonArray)) .mount .mount | quote }}
  {{- else }}
  command: [cp, -a, {{ printf "%s/." .model.image.path | quote }}, {{ .mount | quote }}]
  {{- end }}
  securityContext:
    {{- with (include "tandem.securityContext" $root | trim) }}{{ . | nindent 4 }}{{- end }}
  resources:
    {{- toYaml $root.Values.modelDownloader.resources | nindent 4 }}
  volumeMounts:
    - name: {{ .name }}
      mountPath: {{ .mount }}
{{- end }}
{{- end }}

{{/* The tokenizer's model source: orchestrator.tokenizer.model, or the verifier's. */}}
{{- define "tandem.tokenizerModel" -}}
{{- $m := .Values.orchestrator.tokenizer.model | default dict }}
{{- if $m.source }}
{{- toJson (mergeOverwrite (deepCopy .Values.verifier.model) $m) }}
{{- else }}
{{- toJson .Values.verifier.model }}
{{- end }}
{{- end }}

{{/* ---- The orchestrator ----------------------------------------------------------------------- */}}

{{/* `tandem orchestrator` flags shared by the Deployment's command and the RayService's Serve app. */}}
{{- define "tandem.orchestratorFlags" -}}
{{- $o := .Values.orchestrator }}
{{- /* drafter.kind head: no draft workers. `tandem orchestrator` requires --draft; '' names none
       (the verifiers draft themselves). */}}
{{- $draft := ternary "" (include "tandem.drafterAddress" .) (eq (include "tandem.headDrafter" .) "true") }}
{{- $flags := list "--draft" $draft "--target" (include "tandem.verifierAddress" .) }}
{{- $flags = concat $flags (list "--replicas" (toString (int $o.replicas)) "--max-sessions" (toString (int $o.maxSessions)) "--stream-interval" (toString (int $o.streamInterval)) "--max-gamma" (toString (int $o.maxGamma)) "--verification" $o.verification) }}
{{- $widths := list }}
{{- range $o.treeWidths }}{{ $widths = append $widths (toString (int .)) }}{{ end }}
{{- $flags = concat $flags (list "--draft-shape" $o.draftShape "--tree-widths" (join "," $widths) "--tree-rule" $o.treeRule) }}
{{- $flags = concat $flags (list "--host" "0.0.0.0" "--metrics-port" (ternary (toString (int $o.metricsPort)) "0" .Values.metrics.enabled)) }}
{{- if $o.tokenizer.enabled }}
{{- $flags = concat $flags (list "--tokenizer" (include "tandem.tokenizerPath" .)) }}
{{- end }}
{{- if not $o.draftAhead }}
{{- $flags = append $flags "--no-draft-ahead" }}
{{- end }}
{{- $flags = concat $flags (list "--ahead-guesses" (toString (int $o.aheadGuesses))) }}
{{- $flags = concat $flags (list "--ahead-rejections" (toString (int $o.aheadRejections))) }}
{{- if .Values.tls.enabled }}
{{- $flags = concat $flags (list "--tls-cert" "/etc/tandem/tls/tls.crt" "--tls-key" "/etc/tandem/tls/tls.key" "--tls-ca" "/etc/tandem/tls/ca.crt") }}
{{- end }}
{{- range $o.extraArgs }}
{{- $flags = append $flags (toString .) }}
{{- end }}
{{- toJson $flags }}
{{- end }}

{{/* Serve's HTTP port under KubeRay: orchestrator.httpPort, or Ray's default 8000 when the OpenAI
     API is off (Serve's HTTP proxy still runs there: KubeRay checks its /-/healthz). */}}
{{- define "tandem.servePort" -}}
{{- int .Values.orchestrator.httpPort | default 8000 }}
{{- end }}

{{/* The orchestrator's environment: Redis, the token, tracing, a writable HOME. */}}
{{- define "tandem.orchestratorEnv" -}}
- name: HOME
  value: /tmp
{{- with (include "tandem.redisEnv" . | trim) }}{{ . | nindent 0 }}{{- end }}
{{- with (include "tandem.apiKeyEnv" . | trim) }}{{ . | nindent 0 }}{{- end }}
{{- with (include "tandem.otelEnv" . | trim) }}{{ . | nindent 0 }}{{- end }}
{{- with .Values.orchestrator.extraEnv }}{{ toYaml . | nindent 0 }}{{- end }}
{{- end }}

{{/* Volumes and mounts of an orchestrator pod: tokenizer, TLS, Redis CA, /tmp. */}}
{{- define "tandem.orchestratorVolumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.orchestrator.tokenizer.enabled }}
{{- with (include "tandem.modelVolumes" (dict "root" . "model" (include "tandem.tokenizerModel" . | fromJson) "name" "tokenizer" "mount" "/models/tokenizer") | trim) }}{{ . | nindent 0 }}{{- end }}
{{- end }}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "tandem.orchestratorTLSSecret" . }}
{{- end }}
{{- if and (eq .Values.redis.mode "external") .Values.redis.external.caSecret }}
- name: redis-tls
  secret:
    secretName: {{ .Values.redis.external.caSecret }}
{{- end }}
{{- end }}

{{- define "tandem.orchestratorMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.orchestrator.tokenizer.enabled }}
{{- with (include "tandem.tokenizerMount" . | trim) }}{{ . | nindent 0 }}{{- end }}
{{- end }}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/tandem/tls
  readOnly: true
{{- end }}
{{- if and (eq .Values.redis.mode "external") .Values.redis.external.caSecret }}
- name: redis-tls
  mountPath: /etc/tandem/redis-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* The tokenizer directory: a mount when the source needs one. With an image source and no
     model image, the path inside tandem's image is linked by the flag instead (no mount). */}}
{{- define "tandem.tokenizerMount" -}}
{{- $m := include "tandem.tokenizerModel" . | fromJson }}
{{- include "tandem.modelMounts" (dict "root" . "model" $m "name" "tokenizer" "mount" "/models/tokenizer") }}
{{- end }}

{{/* The tokenizer directory the orchestrator is given. */}}
{{- define "tandem.tokenizerPath" -}}
{{- include "tandem.modelPath" (dict "root" . "model" (include "tandem.tokenizerModel" . | fromJson) "mount" "/models/tokenizer") }}
{{- end }}
