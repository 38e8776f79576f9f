package events

func init() {
	addSamples(map[Type]Payload{
		TypeReplicationApplied: ReplicationApplied{Node: "n2", Source: "n1", Group: "pbx", Tree: "voicemail", Epoch: 7,
			Generation: 1796000734000000000, Digest: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
			Files: 2, Bytes: 48213, Deleted: 1, DurationMS: 12.5},
		TypeReplicationAlarm: ReplicationAlarm{Node: "n2", Source: "n1", Group: "pbx", Tree: "voicemail", Reason: AlarmSafetyValve,
			Deletes: 120, TargetFiles: 400, MaxShare: 0.1, Message: "pass would delete 120 of 400 files (30%), more than 10%"},
		TypeReplicationConflict: ReplicationConflict{Node: "n1", Source: "n2", Group: "pbx", Tree: "voicemail", Count: 1,
			Files: []ConflictFile{{Path: "default/1000/INBOX/msg0003.txt", Reason: "local_only",
				PreservedAs: "/var/lib/fan/replicator/conflicts/voicemail/20261130T023000Z/default/1000/INBOX/msg0003.txt"}}},
	})
}
