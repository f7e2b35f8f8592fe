// Package secure tests the processor against secured services: a Redis with TLS and an ACL user
// limited to the key prefix and the processor's commands, and a Kafka listener with SASL/SCRAM
// over TLS (deploy/local/secure.sh, which writes what the tests need to .cache/secure/env). The
// tests skip when the services are not running, unless CI=true; deploy/local/test.sh starts them,
// runs this package and stops them.
package secure
