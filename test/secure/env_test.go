package secure

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// root is the repository, two levels above this package.
var root, _ = filepath.Abs("../..")

// bin is the repeatrate binary under test, built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "repeatrate-secure")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "repeatrate")
	build := exec.Command("go", "build", "-o", bin, "./cmd/repeatrate")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// services is what deploy/local/secure.sh writes to .cache/secure/env.
type services struct {
	CAFile         string
	RedisAddr      string
	RedisAdminPass string
	RedisUser      string
	RedisPass      string
	Prefix         string
	Brokers        string
	KafkaUser      string
	KafkaPass      string
}

// load reads the services' description, skipping (or failing under CI=true) when they are not
// running.
func load(t *testing.T) services {
	t.Helper()
	file := os.Getenv("REPEATRATE_TEST_SECURE_ENV")
	if file == "" {
		file = filepath.Join(root, ".cache/secure/env")
	}
	skip := func(format string, a ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("the secured services are required under CI=true: "+format, a...)
		}
		t.Skipf("secured services not running (deploy/local/secure.sh start): "+format, a...)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		skip("%v", err)
	}
	kv := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = v
		}
	}
	s := services{CAFile: kv["SECURE_CA_FILE"], RedisAddr: kv["SECURE_REDIS_ADDR"], RedisAdminPass: kv["SECURE_REDIS_ADMIN_PASSWORD"],
		RedisUser: kv["SECURE_REDIS_USERNAME"], RedisPass: kv["SECURE_REDIS_PASSWORD"], Prefix: kv["SECURE_REDIS_PREFIX"],
		Brokers: kv["SECURE_KAFKA_BROKERS"], KafkaUser: kv["SECURE_KAFKA_USERNAME"], KafkaPass: kv["SECURE_KAFKA_PASSWORD"]}
	for _, a := range []string{s.RedisAddr, s.Brokers} {
		c, err := net.DialTimeout("tcp", a, 2*time.Second)
		if err != nil {
			skip("%s: %v", a, err)
		}
		c.Close()
	}
	return s
}

// tlsConfig trusts the services' CA.
func (s services) tlsConfig(t *testing.T) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(s.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", s.CAFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// redisAs returns a client on the secured Redis as user (admin: every command and key).
func (s services) redisAs(t *testing.T, user, pass string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.RedisAddr, Username: user, Password: pass, TLSConfig: s.tlsConfig(t),
		MaxRetries: -1, DialTimeout: 5 * time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

// kafkaEnv is the environment that gives a subcommand the secured Kafka: the SASL password from
// the environment, as the README advises, the rest as flags (kafkaFlags).
func (s services) kafkaEnv() []string {
	return append(os.Environ(), "REPEATRATE_KAFKA_SASL_PASSWORD="+s.KafkaPass)
}

// kafkaFlags are the connection flags of produce and tail for the secured Kafka.
func (s services) kafkaFlags() []string {
	return []string{"--brokers", s.Brokers, "--kafka-tls", "--kafka-tls-ca-file", s.CAFile,
		"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-username", s.KafkaUser}
}

// runEnv configures `run` for the secured services entirely through REPEATRATE_* variables.
func (s services) runEnv(extra ...string) []string {
	return append(append(os.Environ(),
		"REPEATRATE_KAFKA_BROKERS="+s.Brokers,
		"REPEATRATE_KAFKA_TLS=true",
		"REPEATRATE_KAFKA_TLS_CA_FILE="+s.CAFile,
		"REPEATRATE_KAFKA_SASL_MECHANISM=scram-sha-512",
		"REPEATRATE_KAFKA_SASL_USERNAME="+s.KafkaUser,
		"REPEATRATE_KAFKA_SASL_PASSWORD="+s.KafkaPass,
		"REPEATRATE_REDIS_ADDRS="+s.RedisAddr,
		"REPEATRATE_REDIS_TLS=true",
		"REPEATRATE_REDIS_TLS_CA_FILE="+s.CAFile,
		"REPEATRATE_REDIS_USERNAME="+s.RedisUser,
		"REPEATRATE_REDIS_PASSWORD="+s.RedisPass,
		"REPEATRATE_REDIS_KEY_PREFIX="+s.Prefix,
	), extra...)
}

// proc is one processor process.
type proc = testenv.Proc

func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	p, err := testenv.StartProc(args[0], cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("processor log:\n%s", p.Tail(40))
		}
	})
	return p
}

// command runs the binary to its end and returns standard output and error apart.
func command(ctx context.Context, env []string, args ...string) (stdout, stderr []byte, err error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.Bytes(), e.Bytes(), err
}
