// Package packaging holds what installs ferry on a host — the systemd
// unit (ferry.service) and the container build file (Containerfile); see
// README.md here. Its test checks the unit with systemd's own analyser.
package packaging
