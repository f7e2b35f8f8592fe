package alert

import (
	"encoding/json"
	"testing"

	"github.com/repeatrate/repeatrate/schemas"
)

// Decode reads each kind of event the evaluator subscribes to, ignores the others, and refuses
// what cannot be read: the one-pass path for snapshots and the general one agree.
func TestDecodeReadsEveryKind(t *testing.T) {
	event := func(typ string, data any) []byte {
		b, _ := json.Marshal(map[string]any{"specversion": "1.0", "id": "x", "source": "urn:repeatrate", "type": typ, "data": data})
		return b
	}
	s := snap("live", 7, [2]int64{3, 300}, [2]int64{20, 2000}, t0)
	u, ok, err := Decode(event(schemas.TypeSnapshot, s))
	if err != nil || !ok || u.Snapshot == nil || u.Snapshot.Version != 7 || u.Snapshot.Windows.Day.Scored != 300 ||
		!u.Snapshot.ObservedAt.Equal(t0) || u.Snapshot.Aggregate != s.Aggregate {
		t.Fatalf("snapshot: %+v %v %v", u.Snapshot, ok, err)
	}
	disc := &schemas.SuiteDiscrimination{Workspace: "acme", Suite: "s", Revived: []string{"c1"}, RevivedTotal: 1, ObservedAt: t0}
	if u, ok, err := Decode(event(schemas.TypeSuiteDiscrimination, disc)); err != nil || !ok || u.Discrimination == nil || u.Discrimination.Suite != "s" || u.Snapshot != nil {
		t.Fatalf("discrimination: %+v %v %v", u, ok, err)
	}
	stab := &schemas.SuiteStability{Workspace: "acme", Suite: "s", Version: "v1", MissingRunsTotal: 2, ObservedAt: t0}
	if u, ok, err := Decode(event(schemas.TypeSuiteStability, stab)); err != nil || !ok || u.Stability == nil || u.Stability.MissingRunsTotal != 2 {
		t.Fatalf("stability: %+v %v %v", u, ok, err)
	}
	rev := &schemas.CaseRevived{Workspace: "acme", Suite: "s", CaseID: "c1", Version: "v9", Regression: true}
	if u, ok, err := Decode(event(schemas.TypeCaseRevived, rev)); err != nil || !ok || u.Revived == nil || *u.Revived != *rev {
		t.Fatalf("case revived: %+v %v %v", u, ok, err)
	}
	if _, ok, err := Decode(event(schemas.TypeAlertFiring, map[string]any{"rule": "r"})); ok || err != nil {
		t.Fatalf("an alert: read %v, err %v; want it ignored", ok, err)
	}
	for name, b := range map[string][]byte{
		"snapshot without data":           event(schemas.TypeSnapshot, nil),
		"snapshot of another shape":       event(schemas.TypeSnapshot, map[string]any{"version": "seven"}),
		"not JSON":                        []byte("{\"type\":"),
		"discrimination of another shape": event(schemas.TypeSuiteDiscrimination, map[string]any{"revived": 3}),
	} {
		if _, ok, err := Decode(b); err == nil || ok {
			t.Errorf("%s: read %v, err %v; want an error", name, ok, err)
		}
	}
}
