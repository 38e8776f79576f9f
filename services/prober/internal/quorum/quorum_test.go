package quorum

import (
	"testing"

	"github.com/fanpbx/fan/pkg/events"
)

func TestAtLeastNOfM(t *testing.T) {
	const U, D = events.HealthUp, events.HealthDown
	tr := New([]Group{{Name: "web", MinUp: 2, Members: []string{"w1", "w2", "w3"}}, {Name: "dns", MinUp: 1, Members: []string{"d1", "w1"}}})
	steps := []struct {
		check string
		h     events.Health
		want  map[string]events.Health // groups that change, and to what
	}{
		{"w1", U, map[string]events.Health{"dns": U}}, // dns needs 1: w1 is a member of both
		{"w2", D, nil}, // web: 1 up, 1 unknown, 1 down: could still reach 2
		{"w3", D, map[string]events.Health{"web": D}}, // now it cannot
		{"w3", U, map[string]events.Health{"web": U}}, // 2 of 3
		{"d1", D, nil}, // dns still has w1
		{"w1", D, map[string]events.Health{"web": D, "dns": D}},
		{"w2", U, map[string]events.Health{"web": U}},
		{"w2", U, nil}, // no change, no transition
	}
	for i, s := range steps {
		got := map[string]events.Health{}
		for _, c := range tr.Observe(s.check, s.h) {
			got[c.Group] = c.To
			if c.From == c.To || len(c.Members) != c.Total {
				t.Fatalf("step %d: bad change %+v", i, c)
			}
		}
		if len(got) != len(s.want) {
			t.Fatalf("step %d (%s %s): changes %v, want %v", i, s.check, s.h, got, s.want)
		}
		for g, h := range s.want {
			if got[g] != h {
				t.Fatalf("step %d (%s %s): changes %v, want %v", i, s.check, s.h, got, s.want)
			}
		}
	}
}

func TestReasonNamesEveryMember(t *testing.T) {
	tr := New([]Group{{Name: "web", MinUp: 1, Members: []string{"a", "b"}}})
	ch := tr.Observe("a", events.HealthUp)
	if len(ch) != 1 {
		t.Fatalf("changes %+v", ch)
	}
	if got, want := ch[0].Reason(), "1 of 2 up, need 1: a up, b unknown"; got != want {
		t.Fatalf("reason %q, want %q", got, want)
	}
	if tr.Observe("nobody", events.HealthUp) != nil {
		t.Fatal("a check outside every group changed something")
	}
}
