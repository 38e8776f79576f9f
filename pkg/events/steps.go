package events

import "strings"

// Step names of a CommandResult (Step.Name). They are payload: the status
// page, fanctl and the lab's breakdowns read them, so they are named here
// once and the executors note them by these constants. A step that names a
// server is the constant, a colon and the server (StepOn).
const (
	// The execution contract's own steps, in every applied command's
	// result before the executor's: the command received; its epoch found
	// to be a lease term; the command recorded on disk.
	StepReceived    = "received"
	StepTermChecked = "term_checked"
	StepRecorded    = "recorded"

	// The address executor's steps (a claim, then a release).
	StepReleasesConfirmed   = "releases_confirmed"   // every release the claim names was answered
	StepReleasesUnconfirmed = "releases_unconfirmed" // the claim's release wait passed first
	StepProbed              = "probed"
	StepAddressAdded        = "address_added"
	StepAnnounced           = "first_announcement_sent"
	StepGatewayApplied      = "gateway_applied"
	StepPBXAnswering        = "pbx_answering"
	StepPBXVerified         = "pbx_verified"
	StepAddressRemoved      = "address_removed"

	// The dispatcher executor's steps, each noted once Kamailio, read
	// back, shows the states.
	StepDispatcherHolderActive   = "dispatcher_holder_active"
	StepDispatcherOthersDisabled = "dispatcher_others_disabled"
	StepDispatcherNodeDisabled   = "dispatcher_node_disabled"

	// The DNS executor's steps. StepDNSVerified is always, and the other
	// two are in the primaries' mode, suffixed with one server (StepOn).
	StepDNSUpdateAccepted = "dns_update_accepted"
	StepDNSVerified       = "dns_verified"
	StepDNSAlreadyServed  = "dns_already_served"
	StepDNSReleaseNoop    = "dns_release_noop"
)

// StepOn names step as it was noted for one server: "dns_verified:<server>".
func StepOn(step, server string) string { return step + ":" + server }

// StepServer returns the server a step name noted for one server names:
// "example.net:53" of "dns_verified:example.net:53" when step is
// StepDNSVerified; ok is false for any other name.
func StepServer(name, step string) (server string, ok bool) {
	server, ok = strings.CutPrefix(name, step+":")
	if !ok || server == "" {
		return "", false
	}
	return server, true
}
