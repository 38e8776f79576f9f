package events

import (
	"errors"
	"testing"
	"time"
)

func init() {
	addSamples(map[Type]Payload{
		TypeAddressConflict: AddressConflict{Group: "pbx", Node: "n1", Address: "198.51.100.10",
			OwnMAC: "02:00:00:00:00:01", OtherMAC: "02:00:00:00:00:02", Action: ConflictYielded,
			Reason: "arbiter names n2 as holder", Epoch: 3, Holder: "n2", HolderEpoch: 4, DetectedAt: goldenTime},
		TypeAddressCorrection: AddressCorrection{Group: "pbx", Node: "n2", Address: "198.51.100.10/24",
			Kind: CorrectionReadded, Reason: "address vanished from eth0", At: goldenTime},
	})
}

func TestAddressValidate(t *testing.T) {
	good := AddressConflict{Group: "pbx", Node: "n1", Address: "2001:db8::10", OtherMAC: "02:00:00:00:00:02",
		Action: ConflictKept, Reason: "confirmed", DetectedAt: time.Now()}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*AddressConflict){
		"bad address": func(c *AddressConflict) { c.Address = "198.51.100.10/24" },
		"bad mac":     func(c *AddressConflict) { c.OtherMAC = "nope" },
		"bad action":  func(c *AddressConflict) { c.Action = "shrugged" },
		"no reason":   func(c *AddressConflict) { c.Reason = "" },
		"no time":     func(c *AddressConflict) { c.DetectedAt = time.Time{} },
	} {
		c := good
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrMissingField) {
			t.Errorf("%s: Validate = %v", name, err)
		}
	}
	corr := AddressCorrection{Group: "pbx", Node: "n1", Address: "198.51.100.10/24", Kind: CorrectionFailed, At: time.Now()}
	if err := corr.Validate(); !errors.Is(err, ErrMissingField) {
		t.Errorf("failed correction without error: %v", err)
	}
	corr.Error = "netlink: permission denied"
	if err := corr.Validate(); err != nil {
		t.Errorf("failed correction with error: %v", err)
	}
}

func TestAddressSubjects(t *testing.T) {
	env := Envelope{Cluster: "lab"}
	if got := Subject(env, AddressConflict{Node: "n1"}); got != "fan.evt.lab.addr.n1.conflict" {
		t.Errorf("conflict subject %q", got)
	}
	if got := Subject(env, AddressCorrection{Node: "n1"}); got != "fan.evt.lab.addr.n1.correction" {
		t.Errorf("correction subject %q", got)
	}
}
