{{- define "ferry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ferry.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "ferry.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "ferry.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "ferry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ferry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ferry.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "ferry.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The socket directory's mode: the group may enter it (0750); when
socket.mode lets others connect ("0666"), others may pass through it too
(0751), or connecting would still fail on the directory.
*/}}
{{- define "ferry.socketDirMode" -}}
{{- if hasSuffix "0" (toString .Values.socket.mode) }}0750{{ else }}0751{{ end }}
{{- end }}

{{- define "ferry.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ferry.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
ferry's configuration: what the chart must set for the pod (listeners on
the pod's interfaces, the socket and the state in their hostPath
directories, brokers, delivery mode), with .Values.config merged over it.
*/}}
{{- define "ferry.config" -}}
{{- $v := .Values -}}
{{- $p := $v.ports -}}
{{- $local := dict "listen" (ternary (printf "0.0.0.0:%v" $p.local) "" (gt (int $p.local) 0)) -}}
{{- if $v.socket.enabled -}}
{{- $_ := set $local "socket" "/run/ferry/ferry.sock" -}}
{{- $_ := set $local "socket_mode" $v.socket.mode -}}
{{- else -}}
{{- $_ := set $local "socket" "" -}}
{{- end -}}
{{- $_ := set $local "enabled" (or $v.socket.enabled (gt (int $p.local) 0)) -}}
{{- $otlpHTTP := dict "enabled" (gt (int $p.otlpHttp) 0) "listen" (printf "0.0.0.0:%v" $p.otlpHttp) -}}
{{- $otlpGRPC := dict "enabled" (gt (int $p.otlpGrpc) 0) "listen" (printf "0.0.0.0:%v" $p.otlpGrpc) -}}
{{- $base := dict
  "telemetry" (dict "admin" (dict "listen" (printf "0.0.0.0:%v" $p.admin)))
  "receivers" (dict
    "http" (dict "enabled" (gt (int $p.http) 0) "listen" (printf "0.0.0.0:%v" $p.http))
    "otlp" (dict "enabled" (or (gt (int $p.otlpHttp) 0) (gt (int $p.otlpGrpc) 0)) "http" $otlpHTTP "grpc" $otlpGRPC)
    "local" $local
    "files" (dict "checkpoint_dir" "/var/lib/ferry/files"))
  "delivery" (dict
    "mode" $v.deliveryMode
    "spool" (dict "dir" "/var/lib/ferry/spool")
    "dead_letter" (dict "file" "/var/lib/ferry/dead-letters.ndjson"))
  "exporter" (dict "kafka" (dict "brokers" $v.kafka.brokers))
-}}
{{- toYaml (mergeOverwrite $base (deepCopy $v.config)) }}
{{- end }}
