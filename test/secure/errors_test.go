package secure

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A connection that cannot work stops every subcommand at once with its cause — not kafka-go's
// "[8] Broker Not Available", which `run --kafka-create-topics` and `produce` reported for every
// TLS and SASL mistake.
func TestConnectionMistakesNamed(t *testing.T) {
	s := load(t)
	group := func(name string) string { return "REPEATRATE_KAFKA_GROUP_ID=secure-errors-" + name }
	for _, tc := range []struct {
		name string
		cmd  string   // run, produce or tail
		env  []string // over the working configuration
		args []string // over the working flags of produce and tail
		want string
	}{
		{name: "kafka wrong password", cmd: "run", env: []string{"REPEATRATE_KAFKA_SASL_PASSWORD=wrong"},
			want: "authentication failed: wrong kafka.sasl.username or password"},
		{name: "kafka unknown user", cmd: "run", env: []string{"REPEATRATE_KAFKA_SASL_USERNAME=nobody"},
			want: "authentication failed: wrong kafka.sasl.username or password"},
		{name: "kafka wrong mechanism", cmd: "run", env: []string{"REPEATRATE_KAFKA_SASL_MECHANISM=scram-sha-256"},
			want: `the brokers do not accept SASL mechanism "scram-sha-256"`},
		{name: "kafka plain mechanism", cmd: "run", env: []string{"REPEATRATE_KAFKA_SASL_MECHANISM=plain"},
			want: `the brokers do not accept SASL mechanism "plain"`},
		// No CA file: the system's roots, which do not hold the services' CA.
		{name: "kafka unknown CA", cmd: "run", env: []string{"REPEATRATE_KAFKA_TLS_CA_FILE="},
			want: "the brokers' certificate is not signed by a trusted CA"},
		{name: "kafka without TLS", cmd: "run", env: []string{"REPEATRATE_KAFKA_TLS=false"},
			want: "the brokers expect TLS"},
		{name: "kafka without SASL", cmd: "run", env: []string{"REPEATRATE_KAFKA_SASL_MECHANISM="},
			want: "does the listener expect SASL"},
		{name: "redis wrong password", cmd: "run", env: []string{"REPEATRATE_REDIS_PASSWORD=wrong"},
			want: "authentication failed: wrong redis.username or redis.password"},
		{name: "redis unknown CA", cmd: "run", env: []string{"REPEATRATE_REDIS_TLS_CA_FILE="},
			want: "the server's certificate is not signed by a trusted CA"},
		{name: "redis without TLS", cmd: "run", env: []string{"REPEATRATE_REDIS_TLS=false"},
			want: "does it expect TLS"},
		{name: "redis wrong server name", cmd: "run", env: []string{"REPEATRATE_REDIS_TLS_SERVER_NAME=redis.example"},
			want: "the server's certificate does not carry the name checked"},
		{name: "produce wrong password", cmd: "produce", env: []string{"REPEATRATE_KAFKA_SASL_PASSWORD=wrong"},
			want: "authentication failed: wrong kafka.sasl.username or password"},
		{name: "produce unknown CA", cmd: "produce", args: []string{"--kafka-tls-ca-file="},
			want: "the brokers' certificate is not signed by a trusted CA"},
		{name: "tail wrong mechanism", cmd: "tail", args: []string{"--kafka-sasl-mechanism=scram-sha-256"},
			want: `the brokers do not accept SASL mechanism "scram-sha-256"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			var env, args []string
			switch tc.cmd {
			case "run":
				env = s.runEnv(append([]string{group(strings.ReplaceAll(tc.name, " ", "-")), "REPEATRATE_KAFKA_CREATE_TOPICS=true",
					"REPEATRATE_HTTP_ADDR=", "REPEATRATE_KAFKA_INPUT_TOPICS=secure-errors.in"}, tc.env...)...)
				args = []string{"run"}
			default:
				env = append(s.kafkaEnv(), tc.env...)
				args = append(append([]string{tc.cmd, "--topic", "secure-errors.in"}, s.kafkaFlags()...), tc.args...)
				if tc.cmd == "produce" {
					args = append(args, "--in", "/dev/null")
				}
			}
			_, stderr, err := command(ctx, env, args...)
			if ctx.Err() != nil {
				t.Fatalf("%s did not stop within a minute; stderr:\n%s", tc.cmd, stderr)
			}
			if err == nil {
				t.Fatalf("%s succeeded; stderr:\n%s", tc.cmd, stderr)
			}
			last := lastLine(string(stderr))
			if !strings.Contains(last, tc.want) || strings.Contains(last, "Broker Not Available") {
				t.Fatalf("%s ended with\n  %s\nwant it to say %q", tc.cmd, last, tc.want)
			}
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
