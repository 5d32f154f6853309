// Package operate proves the operator's live view against the real ferry
// binary and a real Kafka: a known load (accepted, refused for size, for a
// forged token, for an application's rate limit) is sent over HTTP, then
// the numbers are read back the way an operator reads them: GET /status,
// the status page rendered by a real headless Chromium (its DOM after the
// page's script ran, and a screenshot decoded and checked for content),
// and `ferry top` running in a real tmux terminal at 120x40 and 80x24,
// quit with q. Chromium and tmux are Debian's packages, installed by
// scripts/chromium-local (scripts/test.sh calls it); without them the
// browser and terminal tests fail rather than skip, so CI cannot pass
// without having looked.
package operate
