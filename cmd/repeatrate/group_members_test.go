package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/describegroups"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// A rebuild refuses to run while the processors' group has a member (integration, real Kafka):
// a rebuild beside a running processor would count what it counts twice. Its commit, asked again
// on temporary errors, is refused at once then too.
func TestRebuildRefusesWhileTheGroupHasAMember(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newRebuildFixture(ctx, t)
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: f.cfg.Kafka.Brokers, GroupID: f.cfg.Kafka.GroupID,
		Topic: f.cfg.Kafka.InputTopics[0], MaxWait: 100 * time.Millisecond})
	defer r.Close()
	// A reader of a group joins it as it is made; an error while the coordinator settles is
	// asked again until the test's time runs out.
	for n, err := 0, error(nil); n == 0; n, err = groupMembers(ctx, f.kc.client(), f.cfg.Kafka.GroupID) {
		select {
		case <-ctx.Done():
			t.Fatalf("the reader never joined the group (last: %d members, %v)", n, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	err := runRebuild(ctx, f.cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err == nil || !strings.Contains(err.Error(), "active members") {
		t.Fatalf("rebuild beside a member of the group: %v, want a refusal naming its active members", err)
	}
	// The rebuild's last step, its commit without a generation, is refused while a member holds
	// the group, at once: the refusal is not a temporary error that Commit would wait out.
	err = rebuildKafka{kafkaClients: f.kc}.Commit(ctx, f.cfg.Kafka.GroupID, map[string]map[int]int64{f.cfg.Kafka.InputTopics[0]: {0: 0}})
	var ke kafka.Error
	t.Logf("commit beside a member: %v", err)
	if !errors.As(err, &ke) || ke.Temporary() {
		t.Fatalf("a commit without a generation beside a member of the group: %v, want a refusal that is not temporary", err)
	}
	if n, err := groupMembers(ctx, f.kc.client(), "never-"+f.cfg.Kafka.GroupID); n != 0 || err != nil {
		t.Fatalf("a group that never existed: %d members, %v; want 0 and no error", n, err)
	}
}

// describing answers DescribeGroups with errs in turn (one group, no members), then with the group
// Stable and one member (whose subscription is metadata, when set), or with no group at all when
// none is set.
type describing struct {
	errs     []kafka.Error
	metadata []byte
	none     bool
	calls    int
}

func (d *describing) RoundTrip(_ context.Context, _ net.Addr, req protocol.Message) (protocol.Message, error) {
	r, ok := req.(*describegroups.Request)
	if !ok {
		return nil, fmt.Errorf("unexpected request %T", req)
	}
	d.calls++
	if d.none {
		return &describegroups.Response{}, nil
	}
	g := describegroups.ResponseGroup{GroupID: r.Groups[0], GroupState: "Stable",
		Members: []describegroups.ResponseGroupMember{{MemberID: "m", MemberMetadata: d.metadata}}}
	if d.calls <= len(d.errs) {
		g = describegroups.ResponseGroup{GroupID: r.Groups[0], ErrorCode: int16(d.errs[d.calls-1])}
	}
	return &describegroups.Response{Groups: []describegroups.ResponseGroup{g}}, nil
}

// A group's members are counted only from an answer that says them: a coordinator still loading
// is asked again, a group Kafka does not know has none, and any other error is an error, never an
// empty group.
func TestGroupMembersNeverTakesAnErrorForAnEmptyGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ask := func(d *describing) (n, calls int, err error) {
		n, err = groupMembers(ctx, &kafka.Client{Addr: kafka.TCP("127.0.0.1:9"), Transport: d}, "g")
		return n, d.calls, err
	}
	count := func(errs ...kafka.Error) (n, calls int, err error) { return ask(&describing{errs: errs}) }
	if n, calls, err := count(kafka.NotCoordinatorForGroup, kafka.GroupCoordinatorNotAvailable); n != 1 || err != nil || calls != 3 {
		t.Errorf("a coordinator moving, then the group: %d members, %v after %d calls; want 1 after 3", n, err, calls)
	}
	if n, calls, err := count(kafka.GroupIdNotFound); n != 0 || err != nil || calls != 1 {
		t.Errorf("a group Kafka does not know: %d members, %v after %d calls; want 0, no error, after 1", n, err, calls)
	}
	if _, calls, err := count(kafka.GroupAuthorizationFailed); !errors.Is(err, kafka.GroupAuthorizationFailed) || calls != 1 {
		t.Errorf("refused: %v after %d calls; want Group Authorization Failed after 1", err, calls)
	}
	// A member whose subscription kafka-go cannot read (a newer client's) is still a member.
	if n, calls, err := ask(&describing{metadata: []byte{0, 9}}); err == nil || calls != 1 {
		t.Errorf("a member it cannot read: %d members, %v after %d calls; want an error after 1", n, err, calls)
	}
	if n, _, err := ask(&describing{none: true}); err == nil {
		t.Errorf("an answer without the group: %d members, no error; want an error", n)
	}
}
