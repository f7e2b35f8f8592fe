// Package deploy carries the deployment files a binary needs at run time: the example alerting
// rules that `repeatrate dev --demo` evaluates (README, Alerting). It holds no code.
package deploy

import _ "embed"

// AlertRulesExample is alert-rules.example.yaml, byte for byte.
//
//go:embed alert-rules.example.yaml
var AlertRulesExample []byte
