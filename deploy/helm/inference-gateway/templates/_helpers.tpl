{{/* The labels every object carries; `name` is the component (epp, bbr, envoy, epp-state). */}}
{{- define "ig.labels" -}}
app.kubernetes.io/name: {{ . }}
app.kubernetes.io/part-of: inference-gateway
{{- end }}

{{/* The pool the EPP serves: epp.pool, else the first pool of the config. */}}
{{- define "ig.eppPool" -}}
{{- .Values.epp.pool | default (index .Values.config.pools 0).name -}}
{{- end }}

{{/* A pool's EPP (Deployment, Service, certificate): `epp` for the EPP pool (epp.pool), else
`epp-<pool>`. Called with (list $ poolName). */}}
{{- define "ig.eppName" -}}
{{- $root := index . 0 -}}
{{- $pool := index . 1 -}}
{{- ternary "epp" (printf "epp-%s" $pool) (eq $pool (include "ig.eppPool" $root)) -}}
{{- end }}

{{/* A pool's EPP replicas: the pool's epp.replicas when given, else epp.replicas. (list $ pool) */}}
{{- define "ig.eppReplicas" -}}
{{- $root := index . 0 -}}
{{- $pool := index . 1 -}}
{{- if eq $pool.name (include "ig.eppPool" $root) -}}
{{- $root.Values.epp.replicas -}}
{{- else -}}
{{- (($pool.epp | default dict).replicas) | default $root.Values.epp.replicas -}}
{{- end -}}
{{- end }}

{{/* The in-cluster shared-state store's address (sharedState.enabled). */}}
{{- define "ig.sharedStateUrl" -}}
redis://epp-state:6379/0
{{- end }}

{{/*
The gateway configuration as written to the ConfigMap: config from the values, with each
Kubernetes pool's namespace (the release's, when left out), the EPP pool's replica count and
the in-cluster shared-state store filled in, so each is set in one place.
*/}}
{{/*
The EPP's ext_proc workers (epp/workers/processes.py): epp.workers when set, else the CPU request
rounded up ("500m" -> 1, "2" -> 2, "1500m" -> 2).
*/}}
{{- define "ig.eppWorkers" -}}
{{- if .Values.epp.workers -}}
{{- .Values.epp.workers -}}
{{- else -}}
{{- $cpu := toString (((.Values.epp.resources).requests).cpu | default "1") -}}
{{- if hasSuffix "m" $cpu -}}
{{- div (add (int (trimSuffix "m" $cpu)) 999) 1000 | max 1 -}}
{{- else -}}
{{- ceil (float64 $cpu) | int | max 1 -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ig.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- $eppPool := include "ig.eppPool" . -}}
{{- range $pool := $config.pools -}}
{{- if and (hasKey $pool "kubernetes") (not $pool.kubernetes.namespace) -}}
{{- $_ := set $pool.kubernetes "namespace" $.Release.Namespace -}}
{{- end -}}
{{- $workers := include "ig.eppWorkers" $ -}}
{{- $workers = ternary $workers (int $workers) (eq $workers "auto") -}}
{{- if eq $pool.name $eppPool -}}
{{- $_ := set $pool "epp" (merge (dict "replicas" (int $.Values.epp.replicas) "workers" $workers) ($pool.epp | default dict)) -}}
{{- else -}}
{{- $host := printf "epp-%s.%s.svc.cluster.local" $pool.name $.Release.Namespace -}}
{{- $replicas := int (include "ig.eppReplicas" (list $ $pool)) -}}
{{- $_ := set $pool "epp" (merge ($pool.epp | default dict) (dict "host" $host "port" 9002 "replicas" $replicas "workers" $workers)) -}}
{{- end -}}
{{- end -}}
{{- if .Values.sharedState.enabled -}}
{{- $_ := set $config "sharedState" (merge (dict "redis" (include "ig.sharedStateUrl" .)) ($config.sharedState | default dict)) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end }}

{{/* mTLS flags of BBR and the EPP (cert-manager Secret mounted at /etc/tls). */}}
{{- define "ig.tlsArgs" -}}
{{- if .Values.mtls.enabled }}
- --tls-cert=/etc/tls/tls.crt
- --tls-key=/etc/tls/tls.key
- --tls-client-ca=/etc/tls/ca.crt
{{- end }}
{{- end }}

{{/* The hardened pod and container security settings every component shares. */}}
{{- define "ig.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end }}
