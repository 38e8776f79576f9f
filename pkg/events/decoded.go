package events

// Decoded is a payload as Decode returns it: a pointer to one of the
// registered payload types. Only those pointers implement it (decoded has a
// pointer receiver), so a consumer that takes a Decoded and switches on
// *T cannot be handed a T value that its switch would silently skip.
// Publishers keep building values; the value form is for encoding, the
// pointer form for consuming.
type Decoded interface {
	Payload
	decoded()
}

func (*ProbeResult) decoded()         {}
func (*HealthTransition) decoded()    {}
func (*NodeHeartbeat) decoded()       {}
func (*ArbiterDecision) decoded()     {}
func (*ClaimIP) decoded()             {}
func (*ReleaseIP) decoded()           {}
func (*AnswerPBX) decoded()           {}
func (*CommandResult) decoded()       {}
func (*FailbackPermit) decoded()      {}
func (*ReplicationStatus) decoded()   {}
func (*ServiceAnnounce) decoded()     {}
func (*AddressConflict) decoded()     {}
func (*AddressCorrection) decoded()   {}
func (*CallsAdopted) decoded()        {}
func (*ReplicationHeld) decoded()     {}
func (*CallsSummary) decoded()        {}
func (*DispatcherWeights) decoded()   {}
func (*LeadersHold) decoded()         {}
func (*OperatorAction) decoded()      {}
func (*GroupPin) decoded()            {}
func (*PlannedMove) decoded()         {}
func (*NodePresence) decoded()        {}
func (*ReplicationApplied) decoded()  {}
func (*ReplicationAlarm) decoded()    {}
func (*ReplicationConflict) decoded() {}
func (*ArbiterTerm) decoded()         {}
