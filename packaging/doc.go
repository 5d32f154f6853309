// Package packaging holds what installs and watches ferry: the systemd
// unit (ferry.service), the container build file (Containerfile), the Helm
// chart (helm/ferry), Prometheus alerting rules (prometheus/) and a Grafana
// dashboard (grafana/); see README.md here. Its tests check each with its
// own tool: systemd-analyze, promtool (check rules, test rules), helm (lint,
// template) with ferry validate on the chart's configuration, and the real
// agent's /metrics for every metric name the rules and the dashboard use.
package packaging
