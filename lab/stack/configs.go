package stack

// configTemplates are the lab's service configuration files. They are also
// the shortest complete examples of each service's configuration.
var configTemplates = map[string]string{
	"prober": `cluster: {{.Cluster}}
node: {{.Node}}
bus:
  url: {{.NATS}}
heartbeat_interval: 1s
checks:
  - name: pbx
    kind: ami
    role: self
    address: {{.AMIAddr}}
    username: {{.AMIUser}}
    secret: {{.AMISecret}}
    interval: {{.Interval}}
    timeout: {{.Timeout}}
    rise: {{.Rise}}
    fall: {{.Fall}}
`,
	"ipmover": `cluster: {{.Cluster}}
node: {{.Node}}
bus:
  url: {{.NATS}}
interface: eth0
state_file: {{.Dir}}/{{.Node}}-ipmover-state.json
answer:
  mode: hot
ami:
  address: {{.AMIAddr}}
  username: {{.AMIUser}}
  secret: {{.AMISecret}}
`,
	"replicator": `cluster: {{.Cluster}}
node: {{.Node}}
bus:
  url: {{.NATS}}
`,
	"scheduler": `cluster: {{.Cluster}}
node: {{.Node}}
bus:
  url: {{.NATS}}
`,
	"arbiter": `cluster: {{.Cluster}}
node: {{.Node}}
bus:
  url: {{.NATS}}
lease_ttl: 2s
groups:
  - name: {{.Group}}
    addresses: [{{.VIP}}]
    nodes: [{{range $i, $n := .Nodes}}{{if $i}}, {{end}}{{$n}}{{end}}]
    health_check: pbx
`,
}
