package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// yamlDocs decodes every document of a YAML file.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var d map[string]any
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			return docs
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
}

// at walks a decoded YAML tree along keys (strings for maps, ints for lists).
func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func list(v any) []any { l, _ := v.([]any); return l }

// knownSettings returns run's flag names and REPEATRATE_* variables.
func knownSettings() (flags, envs map[string]bool) {
	flags, envs = map[string]bool{"config": true}, map[string]bool{"REPEATRATE_CONFIG": true}
	var c Config
	for _, s := range c.settings() {
		flags[s.name], envs[s.env()] = true, true
	}
	return flags, envs
}

// checkArgs requires args to be `run` and flags run takes.
func checkArgs(t *testing.T, where string, args []any, flags map[string]bool) {
	t.Helper()
	if len(args) == 0 || args[0] != "run" {
		t.Errorf("%s: command %v is not run", where, args)
		return
	}
	for _, a := range args[1:] {
		s, _ := a.(string)
		if name, ok := strings.CutPrefix(s, "--"); ok {
			name, _, _ = strings.Cut(name, "=")
			if !flags[name] {
				t.Errorf("%s: flag --%s does not exist (config.go)", where, name)
			}
		}
	}
}

// The deploy files name only settings that exist, and keep them secure: TLS on every connection
// that carries a password, nothing published beyond loopback by compose, and the same
// least-privilege Redis ACL in docs/operations.md, the compose file and the tested secure.sh.
func TestDeployFilesUseKnownSettings(t *testing.T) {
	root := "../.."
	flags, envs := knownSettings()

	// Kubernetes.
	var docs []map[string]any
	for _, f := range []string{"deploy/k8s/repeatrate.yaml", "deploy/k8s/secret.example.yaml"} {
		docs = append(docs, yamlDocs(t, filepath.Join(root, f))...)
	}
	kinds := map[string]map[string]any{}
	for _, d := range docs {
		kinds[d["kind"].(string)+"/"+at(d, "metadata", "name").(string)] = d
	}
	for _, want := range []string{"Deployment/repeatrate", "PodDisruptionBudget/repeatrate", "Service/repeatrate",
		"ConfigMap/repeatrate-env", "Secret/repeatrate", "ConfigMap/repeatrate-ca", "ServiceAccount/repeatrate"} {
		if kinds[want] == nil {
			t.Errorf("deploy/k8s has no %s", want)
		}
	}
	cm, _ := at(kinds["ConfigMap/repeatrate-env"], "data").(map[string]any)
	for k := range cm {
		if !envs[k] {
			t.Errorf("ConfigMap repeatrate-env: %s is not a setting (config.go)", k)
		}
	}
	secret, _ := at(kinds["Secret/repeatrate"], "stringData").(map[string]any)
	dep := kinds["Deployment/repeatrate"]
	containers := list(at(dep, "spec", "template", "spec", "containers"))
	if len(containers) == 0 {
		t.Fatal("the Deployment has no container")
	}
	env := map[string]string{}
	for k, v := range cm {
		env[k], _ = v.(string)
	}
	for _, c := range containers {
		checkArgs(t, "Deployment", list(at(c, "args")), flags)
		for _, e := range list(at(c, "env")) {
			name, _ := at(e, "name").(string)
			if strings.HasPrefix(name, "REPEATRATE_") && !envs[name] {
				t.Errorf("Deployment: %s is not a setting (config.go)", name)
			}
			if v, ok := at(e, "value").(string); ok {
				env[name] = v
			}
			if key, ok := at(e, "valueFrom", "secretKeyRef", "key").(string); ok {
				if _, ok := secret[key]; !ok || at(e, "valueFrom", "secretKeyRef", "name") != "repeatrate" {
					t.Errorf("Deployment: %s comes from Secret key %q, which secret.example.yaml does not have", name, key)
				}
				env[name] = "(secret)"
			}
		}
	}
	if env["REPEATRATE_REDIS_PASSWORD"] != "" && env["REPEATRATE_REDIS_TLS"] != "true" {
		t.Error("Kubernetes: the Redis password is sent without TLS (REPEATRATE_REDIS_TLS must be true)")
	}
	if env["REPEATRATE_KAFKA_SASL_PASSWORD"] != "" && env["REPEATRATE_KAFKA_TLS"] != "true" {
		t.Error("Kubernetes: the Kafka password is sent without TLS (REPEATRATE_KAFKA_TLS must be true)")
	}
	for k, v := range env {
		if strings.HasSuffix(k, "_INSECURE_SKIP_VERIFY") && v != "false" {
			t.Errorf("Kubernetes: %s=%s", k, v)
		}
	}
	if len(strings.Split(env["REPEATRATE_REDIS_ADDRS"], ",")) < 3 || len(strings.Split(env["REPEATRATE_KAFKA_BROKERS"], ",")) < 3 {
		t.Error("Kubernetes: configure a Redis Cluster and three brokers or more")
	}
	if at(kinds["Service/repeatrate"], "spec", "type") != "ClusterIP" {
		t.Error("the Service must be ClusterIP: the read side is published only through an Ingress with TLS")
	}

	// docker-compose.yml.
	compose := yamlDocs(t, filepath.Join(root, "docker-compose.yml"))[0]
	services, _ := compose["services"].(map[string]any)
	for name, svc := range services {
		for _, p := range list(at(svc, "ports")) {
			if s, _ := p.(string); !strings.HasPrefix(s, "127.0.0.1:") {
				t.Errorf("compose: %s publishes %q beyond the host's loopback", name, s)
			}
		}
	}
	// Kafka has no authentication in compose: published even on loopback, any local user could
	// write any workspace past the ingest's tokens.
	if ps := list(at(services["kafka"], "ports")); len(ps) > 0 {
		t.Errorf("compose: Kafka, unauthenticated, is published on %v", ps)
	}
	if l, _ := at(services["kafka"], "environment", "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP").(string); strings.Contains(l, "HOST:") {
		t.Errorf("compose: Kafka keeps a host listener: %s", l)
	}
	rr := services["repeatrate"]
	checkArgs(t, "compose repeatrate", list(at(rr, "command")), flags)
	renv, _ := at(rr, "environment").(map[string]any)
	for k := range renv {
		if strings.HasPrefix(k, "REPEATRATE_") && !envs[k] {
			t.Errorf("compose: %s is not a setting (config.go)", k)
		}
	}
	if renv["REPEATRATE_REDIS_PASSWORD"] == nil {
		t.Error("compose: the processor gives Redis no password")
	}
	redisCmd := strings.Join(strings.Fields(strings.ReplaceAll(at(services["redis"], "command", 2).(string), `"`, "")), " ")
	if !strings.Contains(redisCmd, "--user default off") {
		t.Errorf("compose: Redis's default user is not off: %s", redisCmd)
	}

	// One least-privilege ACL line.
	readme, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`ACL SETUSER repeatrate on >PASSWORD (.*)`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("docs/operations.md has no least-privilege ACL line")
	}
	acl := string(m[1])
	script, err := os.ReadFile(filepath.Join(root, "deploy/local/secure.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), "REDIS_ACL='"+acl+"'") {
		t.Errorf("deploy/local/secure.sh (what test/secure checks) does not hold the ACL line of docs/operations.md %q", acl)
	}
	if !strings.Contains(redisCmd, `--user repeatrate on >$$REDIS_PASSWORD `+acl) {
		t.Errorf("compose: the repeatrate user's ACL is not the line of docs/operations.md:\n%s\nwant …%s", redisCmd, acl)
	}
}
