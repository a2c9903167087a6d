package e2e

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"

	"github.com/gpuiso/gpuiso/node"
)

// metadataPath is where a container of a pod made by withClaim finds the
// device metadata of its claim's request "gpus" (claimTemplate's).
var metadataPath = metadata.ResourceClaimTemplateFilePath(driver, "gpus", "gpus")

// metadataStep is the probe's step that prints the claim's device metadata
// file (for isolationArgs' extra).
func metadataStep() []string { return []string{"cat", metadataPath} }

// checkMetadata checks the device metadata file the probe printed (see
// metadataStep): its first object (the newest version the plugin writes)
// describes exactly the devices of uuids, each with the UUID and PCI bus
// id inv gives it.
func checkMetadata(t *testing.T, out string, inv *node.Inventory, uuids []string) {
	t.Helper()
	var raw string
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, "cat "+metadataPath+" "); ok {
			raw = rest
		}
	}
	content, err := strconv.Unquote(raw)
	if err != nil {
		t.Fatalf("no device metadata file in the pod (%q): %v", raw, err)
	}
	var md v1beta1.DeviceMetadata
	if err := json.NewDecoder(strings.NewReader(content)).Decode(&md); err != nil {
		t.Fatalf("the device metadata file: %v\n%s", err, content)
	}
	if len(md.Requests) != 1 || md.Requests[0].Name != "gpus" {
		t.Fatalf("the device metadata's requests: %+v", md.Requests)
	}
	busIDs := map[string]string{}
	for _, d := range inv.Devices {
		busIDs[d.UUID] = d.BusID
	}
	var got []string
	for _, d := range md.Requests[0].Devices {
		uuid := d.Attributes["uuid"].StringValue
		bus := d.Attributes["resource.kubernetes.io/pciBusID"].StringValue
		if d.Driver != driver || uuid == nil || bus == nil {
			t.Errorf("device metadata %+v: no driver, uuid or PCI bus id", d)
			continue
		}
		if *bus != busIDs[*uuid] {
			t.Errorf("device %s: PCI bus id %s in its metadata, %s on the node", *uuid, *bus, busIDs[*uuid])
		}
		got = append(got, *uuid)
	}
	want := slices.Clone(uuids)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the device metadata names %v, the claim holds %v", got, uuids)
	}
}
