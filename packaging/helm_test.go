package packaging

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const chartDir = "helm/ferry"

// rendered is a chart's manifests by kind (one of each kind here).
type rendered map[string]map[string]any

// helmTemplate renders the chart with args (--set ..., -f ...).
func helmTemplate(t *testing.T, helm string, args ...string) (rendered, error) {
	t.Helper()
	cmd := exec.Command(helm, append([]string{"template", "ferry", chartDir, "--namespace", "telemetry"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm template %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	docs := rendered{}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var d map[string]any
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("helm template's output is not YAML: %v\n%s", err, out)
		}
		if d == nil {
			continue
		}
		kind, _ := d["kind"].(string)
		if _, dup := docs[kind]; dup {
			t.Fatalf("two %s manifests", kind)
		}
		docs[kind] = d
	}
	return docs, nil
}

// get walks a decoded YAML document: keys for maps, "name=X" for the
// element of a list whose name is X, or an index.
func get(t *testing.T, v any, path ...string) any {
	t.Helper()
	for i, p := range path {
		switch x := v.(type) {
		case map[string]any:
			v = x[p]
		case []any:
			found := false
			if name, ok := strings.CutPrefix(p, "name="); ok {
				for _, e := range x {
					if m, _ := e.(map[string]any); m != nil && m["name"] == name {
						v, found = e, true
						break
					}
				}
			} else {
				var n int
				if _, err := fmt.Sscan(p, &n); err == nil && n < len(x) {
					v, found = x[n], true
				}
			}
			if !found {
				return nil
			}
		default:
			t.Fatalf("%s: %T is not a map or a list", strings.Join(path[:i+1], "."), v)
		}
	}
	return v
}

func str(v any) string { return fmt.Sprint(v) }

// chartCase is one set of values and what the rendering must show.
type chartCase struct {
	name       string
	args       []string
	env        []string // for ferry validate (secrets the config names)
	stateDir   string
	socketDir  string // "" = no socket
	hostPorts  bool
	ports      map[string]int // container port name -> port ferry listens on
	mode       string
	brokers    []string
	validateOK bool   // false: ferry validate must refuse the configuration
	refusal    string // ... naming this
}

// TestHelmChart: helm lint accepts the chart; helm template renders it
// with the default values and others into a DaemonSet whose spool and
// socket live in hostPath directories, whose probes ask /healthz and
// /readyz on the admin port ferry listens on, which runs as a non-root
// user on a read-only root file system without capabilities, and whose
// ConfigMap holds a configuration `ferry validate` (the real binary)
// accepts, its listeners on the container's ports, its socket and spool
// on the mounts. A configuration the agent would refuse is refused by
// validate too, and values the chart cannot honour fail to render.
func TestHelmChart(t *testing.T) {
	helm := tool(t, "helm-local", "build", "path")
	t.Logf("%s", strings.TrimSpace(run(t, helm, "lint", "--strict", chartDir)))

	dir := t.TempDir()
	custom := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(custom, []byte(`
deliveryMode: spill
kafka: {brokers: ["k1.kafka:9092", "k2.kafka:9092"]}
stateDir: {hostPath: /data/ferry}
socket: {hostPath: /var/run/ferry-apps, mode: "0666"}
ports: {local: 8090, otlpGrpc: 0}
hostPorts: {enabled: true}
networkPolicy: {enabled: true, metricsFrom: [{namespaceSelector: {matchLabels: {name: monitoring}}}]}
config:
  queue: {memory_limit: 512MiB}
  receivers:
    http: {auth: {mode: required}}
  auth:
    keys: [{id: 1, secret: "${FERRY_TOKEN_KEY_1}", issue: true}]
extraEnv:
  - name: FERRY_TOKEN_KEY_1
    valueFrom: {secretKeyRef: {name: ferry-keys, key: key-1}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	// lint renders NOTES.txt too, which helm template leaves out
	run(t, helm, "lint", "--strict", chartDir, "-f", custom)
	defaultPorts := map[string]int{"admin": 8089, "http": 8088, "otlp-grpc": 4317, "otlp-http": 4318}
	cases := []chartCase{
		{name: "default values", stateDir: "/var/lib/ferry", socketDir: "/run/ferry", ports: defaultPorts,
			mode: "spool", brokers: []string{"kafka:9092"}, validateOK: true},
		{name: "custom values", args: []string{"-f", custom}, env: []string{"FERRY_TOKEN_KEY_1=" + strings.Repeat("cd", 32)},
			stateDir: "/data/ferry", socketDir: "/var/run/ferry-apps", hostPorts: true,
			ports: map[string]int{"admin": 8089, "http": 8088, "otlp-http": 4318, "local": 8090},
			mode:  "spill", brokers: []string{"k1.kafka:9092", "k2.kafka:9092"}, validateOK: true},
		{name: "no socket, kafka mode", args: []string{"--set", "socket.enabled=false", "--set", "deliveryMode=kafka", "--set", "service.enabled=false"},
			stateDir: "/var/lib/ferry", ports: defaultPorts, mode: "kafka", brokers: []string{"kafka:9092"}, validateOK: true},
		// the chart renders it; the agent would not start with it
		{name: "memory_limit below a request", args: []string{"--set", "config.queue.memory_limit=1MiB"},
			stateDir: "/var/lib/ferry", socketDir: "/run/ferry", ports: defaultPorts, mode: "spool", brokers: []string{"kafka:9092"},
			refusal: "exceeds queue.memory_limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			docs, err := helmTemplate(t, helm, c.args...)
			if err != nil {
				t.Fatal(err)
			}
			checkChart(t, docs, c)
		})
	}

	// Values the chart cannot honour fail at helm template, saying why.
	for _, bad := range []struct{ set, why string }{
		{"ports.admin=0", "ports.admin must be set"},
		{"kafka.brokers=null", "kafka.brokers must name at least one broker"},
	} {
		if _, err := helmTemplate(t, helm, "--set", bad.set); err == nil || !strings.Contains(err.Error(), bad.why) {
			t.Errorf("--set %s: %v, want an error saying %q", bad.set, err, bad.why)
		}
	}
}

func checkChart(t *testing.T, docs rendered, c chartCase) {
	ds := docs["DaemonSet"]
	if ds == nil || ds["apiVersion"] != "apps/v1" {
		t.Fatalf("no apps/v1 DaemonSet in %v", docs)
	}
	spec := get(t, ds, "spec", "template", "spec")
	if get(t, ds, "spec", "updateStrategy", "rollingUpdate", "maxSurge") != 0 {
		t.Error("a rolling update may run two agents on a node (maxSurge is not 0): they would share the spool")
	}
	if hn := get(t, spec, "hostNetwork"); hn == true {
		t.Error("hostNetwork: the agent's listeners would be on the node's interfaces")
	}
	if get(t, spec, "tolerations") == nil {
		t.Error("no tolerations: tainted nodes would have no agent")
	}

	// hostPath volumes and where they are mounted
	vol := func(name string) (path string, ok bool) {
		v := get(t, spec, "volumes", "name="+name)
		if v == nil {
			return "", false
		}
		if typ := get(t, v, "hostPath", "type"); typ != "DirectoryOrCreate" {
			t.Errorf("volume %s: hostPath type %v", name, typ)
		}
		return str(get(t, v, "hostPath", "path")), true
	}
	ctr := get(t, spec, "containers", "name=ferry")
	if ctr == nil {
		t.Fatal("no container ferry")
	}
	mount := func(name string) string { return str(get(t, ctr, "volumeMounts", "name="+name, "mountPath")) }
	if p, ok := vol("state"); !ok || p != c.stateDir || mount("state") != "/var/lib/ferry" {
		t.Errorf("state: hostPath %q (want %q) mounted at %q", p, c.stateDir, mount("state"))
	}
	p, ok := vol("socket")
	if c.socketDir == "" && ok {
		t.Error("a socket volume with socket.enabled=false")
	}
	if c.socketDir != "" && (!ok || p != c.socketDir || mount("socket") != "/run/ferry") {
		t.Errorf("socket: hostPath %q (want %q) mounted at %q", p, c.socketDir, mount("socket"))
	}
	if get(t, ctr, "volumeMounts", "name=config", "readOnly") != true || mount("config") != "/etc/ferry" {
		t.Error("the configuration is not mounted read-only at /etc/ferry")
	}
	if args := fmt.Sprint(get(t, ctr, "args")); args != "[run -c /etc/ferry/ferry.yaml]" {
		t.Errorf("args %s", args)
	}

	// probes on the admin port
	for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		if get(t, ctr, probe, "httpGet", "path") != path || get(t, ctr, probe, "httpGet", "port") != "admin" {
			t.Errorf("%s: %v, want GET %s on port admin", probe, get(t, ctr, probe), path)
		}
	}
	// ports: the ones expected, hostPort only on ingest ports and only when asked
	ports := map[string]int{}
	for _, e := range get(t, ctr, "ports").([]any) {
		name := str(get(t, e, "name"))
		ports[name] = get(t, e, "containerPort").(int)
		hp := get(t, e, "hostPort")
		if hp != nil && (!c.hostPorts || name == "admin") {
			t.Errorf("port %s has hostPort %v", name, hp)
		}
		if hp == nil && c.hostPorts && name != "admin" {
			t.Errorf("port %s has no hostPort with hostPorts.enabled", name)
		}
	}
	if fmt.Sprint(ports) != fmt.Sprint(c.ports) {
		t.Errorf("container ports %v, want %v", ports, c.ports)
	}

	// security
	for key, want := range map[string]any{"runAsNonRoot": true, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false} {
		if got := get(t, ctr, "securityContext", key); got != want {
			t.Errorf("securityContext.%s: %v, want %v", key, got, want)
		}
	}
	if u, _ := get(t, ctr, "securityContext", "runAsUser").(int); u == 0 {
		t.Error("the agent runs as root")
	}
	if fmt.Sprint(get(t, ctr, "securityContext", "capabilities", "drop")) != "[ALL]" || get(t, ctr, "securityContext", "capabilities", "add") != nil {
		t.Errorf("capabilities: %v", get(t, ctr, "securityContext", "capabilities"))
	}
	if get(t, ctr, "resources", "limits", "memory") == nil {
		t.Error("no memory limit")
	}
	init := get(t, spec, "initContainers", "name=own-dirs")
	if fmt.Sprint(get(t, init, "securityContext", "capabilities", "add")) != "[CHOWN FOWNER]" {
		t.Errorf("the init container may do more than own the directories: %v", get(t, init, "securityContext"))
	}
	// whoever socket_mode lets connect must be able to enter the socket's
	// directory too: a "0666" socket in a 0750 directory is open to no one
	// outside the group
	if c.socketDir != "" {
		cmd := fmt.Sprint(get(t, init, "command"))
		m := regexp.MustCompile(`chmod (0[0-7]{3}) /run/ferry`).FindStringSubmatch(cmd)
		sm, _ := get(t, docs["ConfigMap"], "data", "ferry.yaml").(string)
		others := regexp.MustCompile(`socket_mode: "0[0-7][0-7]([0-7])"`).FindStringSubmatch(sm)
		switch {
		case m == nil || others == nil:
			t.Errorf("no chmod of the socket directory (%s), or no socket_mode in the configuration", cmd)
		case others[1] != "0" && (m[1][3]-'0')&1 == 0:
			t.Errorf("%s lets others connect, but the socket directory is %s: they cannot enter it", others[0], m[1])
		case others[1] == "0" && m[1][3] != '0':
			t.Errorf("the socket directory is %s, more open than socket_mode asks (%s)", m[1], others[0])
		}
	}

	// the Service: the ingest ports, the node's own agent, never the admin port
	if svc := docs["Service"]; svc != nil {
		if get(t, svc, "spec", "internalTrafficPolicy") != "Local" {
			t.Error("the Service may send a pod's records to another node's agent")
		}
		for _, e := range get(t, svc, "spec", "ports").([]any) {
			target := str(get(t, e, "targetPort"))
			if target == "admin" || ports[target] == 0 {
				t.Errorf("Service port %v targets %q", get(t, e, "name"), target)
			}
		}
	}

	// the configuration
	cm := docs["ConfigMap"]
	text, _ := get(t, cm, "data", "ferry.yaml").(string)
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
		t.Fatalf("ConfigMap ferry.yaml: %v\n%s", err, text)
	}
	port := func(listen any) int {
		_, p, err := net.SplitHostPort(str(listen))
		if err != nil {
			return -1
		}
		var n int
		fmt.Sscan(p, &n)
		return n
	}
	if port(get(t, cfg, "telemetry", "admin", "listen")) != ports["admin"] {
		t.Errorf("admin listens on %v, the probes ask port %d", get(t, cfg, "telemetry", "admin", "listen"), ports["admin"])
	}
	listeners := map[string][]string{"http": {"receivers", "http"}, "otlp-http": {"receivers", "otlp", "http"}, "otlp-grpc": {"receivers", "otlp", "grpc"}}
	for name, path := range listeners {
		on := get(t, cfg, append(path, "enabled")...) == true
		if on != (ports[name] != 0) || on && port(get(t, cfg, append(path, "listen")...)) != ports[name] {
			t.Errorf("%s: enabled %v listen %v; container port %d", name, on, get(t, cfg, append(path, "listen")...), ports[name])
		}
	}
	if c.ports["local"] != port(get(t, cfg, "receivers", "local", "listen")) && !(c.ports["local"] == 0 && get(t, cfg, "receivers", "local", "listen") == "") {
		t.Errorf("local protocol TCP listen %v, container port %d", get(t, cfg, "receivers", "local", "listen"), c.ports["local"])
	}
	sock := str(get(t, cfg, "receivers", "local", "socket"))
	if c.socketDir != "" && filepath.Dir(sock) != "/run/ferry" || c.socketDir == "" && sock != "" {
		t.Errorf("the socket %q is not in the socket's mount", sock)
	}
	for _, path := range [][]string{{"delivery", "spool", "dir"}, {"delivery", "dead_letter", "file"}, {"receivers", "files", "checkpoint_dir"}} {
		if p := str(get(t, cfg, path...)); !strings.HasPrefix(p, "/var/lib/ferry/") {
			t.Errorf("%s = %q is not in the state mount: it would not outlive the pod", strings.Join(path, "."), p)
		}
	}
	if get(t, cfg, "delivery", "mode") != c.mode || fmt.Sprint(get(t, cfg, "exporter", "kafka", "brokers")) != fmt.Sprint(c.brokers) {
		t.Errorf("mode %v brokers %v, want %s %v", get(t, cfg, "delivery", "mode"), get(t, cfg, "exporter", "kafka", "brokers"), c.mode, c.brokers)
	}

	if ferryBin == "" {
		t.Log("-short: the configuration is not given to ferry validate")
		return
	}
	f := filepath.Join(t.TempDir(), "ferry.yaml")
	if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(ferryBin, "validate", "-c", f)
	cmd.Env = append(os.Environ(), c.env...)
	out, err := cmd.CombinedOutput()
	switch {
	case c.validateOK && err != nil:
		t.Errorf("ferry validate refuses the chart's configuration: %v\n%s\n%s", err, out, text)
	case !c.validateOK && (err == nil || !strings.Contains(string(out), c.refusal)):
		t.Errorf("ferry validate: %v %s; want a refusal saying %q", err, out, c.refusal)
	default:
		t.Logf("ferry validate: %s", strings.TrimSpace(string(out)))
	}
}
