package events

// JetStream's own API and advisory subjects that fan uses to keep raft
// leaders on chosen servers (the arbiter's leader steward). They are
// nats-server's contract, not fan's, but they are built here, once, so that
// permissions and code agree on them.
const (
	jsAPIPrefix      = "$JS.API"
	jsAdvisoryPrefix = "$JS.EVENT.ADVISORY"
)

// JSStreamLeaderStepDownSubject asks a stream's raft leader to hand over,
// to the server named in the request's placement.preferred (nats-server 2.11+).
func JSStreamLeaderStepDownSubject(stream string) string {
	return jsAPIPrefix + ".STREAM.LEADER.STEPDOWN." + stream
}

// JSConsumerLeaderStepDownSubject does the same for one durable consumer,
// which is a raft group of its own.
func JSConsumerLeaderStepDownSubject(stream, consumer string) string {
	return jsAPIPrefix + ".CONSUMER.LEADER.STEPDOWN." + stream + "." + consumer
}

// JSMetaLeaderStepDownSubject asks the meta leader (which creates every
// consumer, ordered ones included) to hand over; system account only.
const JSMetaLeaderStepDownSubject = jsAPIPrefix + ".META.LEADER.STEPDOWN"

// JSServerPingJSZ asks every server for its JetStream report, the meta
// group's leader and peers among it; system account only.
const JSServerPingJSZ = "$SYS.REQ.SERVER.PING.JSZ"

// JSStreamLeaderElectedAdvisory is published when a stream elects a leader.
func JSStreamLeaderElectedAdvisory(stream string) string {
	return jsAdvisoryPrefix + ".STREAM.LEADER_ELECTED." + stream
}

// JSConsumerLeaderElectedAdvisory is published when a consumer of stream
// elects a leader; consumer "*" matches all of them.
func JSConsumerLeaderElectedAdvisory(stream, consumer string) string {
	return jsAdvisoryPrefix + ".CONSUMER.LEADER_ELECTED." + stream + "." + consumer
}

// JSMetaLeaderElectedAdvisory is published, in the system account, when the
// meta group elects a leader.
const JSMetaLeaderElectedAdvisory = jsAdvisoryPrefix + ".DOMAIN.LEADER_ELECTED"

// JSStreamMsgGetSubject reads one message of a stream through its raft
// leader. A direct get (what a KV Get sends) may be answered by any
// replica, a lagging one too: a server just back from a partition answers
// with what it had before it.
func JSStreamMsgGetSubject(stream string) string {
	return jsAPIPrefix + ".STREAM.MSG.GET." + stream
}

// KVStreamName is the stream that backs a key-value bucket.
func KVStreamName(bucket string) string { return "KV_" + bucket }

// ObjectStreamName is the stream that backs an object store.
func ObjectStreamName(bucket string) string { return "OBJ_" + bucket }

// ObjectMetaSubjects matches the records an object store keeps of its
// objects: one subject per object name, whose newest message is the
// object's description (deleted set once it is removed).
func ObjectMetaSubjects(bucket string) string { return "$O." + bucket + ".M.>" }

// LedStreams are fan's streams whose raft leaders (with their durable
// consumers') the arbiter keeps on bus.leader_servers: every stream fan
// provisions, the state and call buckets' and the replicator's object
// stores included. A write to any of them stalls while its leader's host is down
// and an election runs.
func LedStreams() []string {
	return []string{CommandsStream, EventsStream, LiveStream, KVStreamName(StateBucket), KVStreamName(CallsBucket),
		ObjectStreamName(ReplBlobBucket), ObjectStreamName(ReplManifestBucket)}
}

// JSServerPingVarz asks every server for its general report (which says,
// among the rest, when its TLS certificates expire); system account only.
const JSServerPingVarz = "$SYS.REQ.SERVER.PING.VARZ"

// JSStreamSnapshotSubject asks a stream's leader for a snapshot of the
// stream (its messages with their sequences, times and headers), sent in
// chunks to a subject of the asker's; fanctl backup uses it.
func JSStreamSnapshotSubject(stream string) string {
	return jsAPIPrefix + ".STREAM.SNAPSHOT." + stream
}

// JSStreamRestoreSubject asks the cluster to create a stream from a
// snapshot (fanctl restore); it is refused while the stream exists.
func JSStreamRestoreSubject(stream string) string {
	return jsAPIPrefix + ".STREAM.RESTORE." + stream
}

// JSSnapshotSubjects are where a snapshot's chunks are acknowledged and a
// restore's chunks are sent: the admin needs them besides the API calls.
const JSSnapshotSubjects = "$JS.SNAPSHOT.>"
