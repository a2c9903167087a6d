package hwtest_test

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

// Clock-event reason bits (nvmlClocksEventReasons) that tell a slowdown.
const (
	clocksSWThermal  = 0x20
	clocksHWThermal  = 0x40
	clocksPowerBrake = 0x80
)

// TestHealthSignals reads, on every GPU, each health signal its driver
// offers and reports what it answered: the recovery action (NVML's
// GPU_RECOVERY_ACTION field), remapped rows (corrected, uncorrected,
// pending, failed), retired pages (by cause, and pending), every NVLink's
// state and error counters, the PCIe replay counter, the clock-event
// reasons (thermal, power brake) and which events the GPU can tell (XID,
// double-bit ECC, recovery action). It then reads them as the health
// monitor does (nvmlnode.ReadHealth) and classifies what holds by the
// default health table. It only reads: it changes nothing on a GPU, and
// never resets one. It fails where a GPU is lost, where the monitor's
// reading disagrees with the calls it is made of, or where a GPU cannot
// tell XID events.
func TestHealthSignals(t *testing.T) {
	testenv.RequireGPU(t)
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("NVML init: %v", ret)
	}
	defer lib.Shutdown()
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		t.Logf("driver %s", v)
	}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS || count == 0 {
		t.Fatalf("GPU count: %d, %v", count, ret)
	}
	table := node.DefaultHealthTable()
	for i := range count {
		t.Run(fmt.Sprintf("gpu%d", i), func(t *testing.T) {
			h, ret := lib.DeviceGetHandleByIndex(i)
			if ret != nvml.SUCCESS {
				t.Fatalf("handle: %v", ret)
			}
			uuid, _ := h.GetUUID()
			name, _ := h.GetName()
			t.Logf("%s %s", name, uuid)
			report := func(signal string, ret nvml.Return, value string) {
				if ret != nvml.SUCCESS {
					value = ret.Error()
				}
				t.Logf("  %-26s %s", signal, value)
			}

			fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
			ret = h.GetFieldValues(fv)
			if ret == nvml.SUCCESS {
				ret = nvml.Return(fv[0].NvmlReturn)
			}
			recovery := uint64(binary.NativeEndian.Uint32(fv[0].Value[:4]))
			recoveryKnown := ret == nvml.SUCCESS
			report("recovery action", ret, fmt.Sprint(recovery))

			corrected, uncorrected, pending, failed, ret := h.GetRemappedRows()
			report("remapped rows", ret, fmt.Sprintf("corrected %d, uncorrected %d, pending %v, failed %v", corrected, uncorrected, pending, failed))
			for _, cause := range []nvml.PageRetirementCause{nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR} {
				pages, ret := h.GetRetiredPages(cause)
				report(fmt.Sprintf("retired pages (cause %d)", cause), ret, fmt.Sprint(len(pages)))
			}
			pagesPending, ret := h.GetRetiredPagesPendingStatus()
			report("retired pages pending", ret, fmt.Sprint(pagesPending == nvml.FEATURE_ENABLED))

			var up []int
			links := 0
			for l := range nvml.NVLINK_MAX_LINKS {
				state, ret := h.GetNvLinkState(l)
				if ret != nvml.SUCCESS {
					if l == 0 {
						report("nvlink", ret, "")
					}
					continue
				}
				links++
				var counters []string
				for c := nvml.NVLINK_ERROR_DL_REPLAY; c < nvml.NVLINK_ERROR_COUNT; c++ {
					v, ret := h.GetNvLinkErrorCounter(l, c)
					if ret != nvml.SUCCESS {
						counters = append(counters, fmt.Sprintf("%d: %v", c, ret))
						continue
					}
					counters = append(counters, fmt.Sprintf("%d: %d", c, v))
				}
				if state == nvml.FEATURE_ENABLED {
					up = append(up, l)
				}
				report(fmt.Sprintf("nvlink %d", l), nvml.SUCCESS, fmt.Sprintf("up %v, errors {%s}", state == nvml.FEATURE_ENABLED, strings.Join(counters, ", ")))
			}
			replays, ret := h.GetPcieReplayCounter()
			report("pcie replay counter", ret, fmt.Sprint(replays))
			reasons, ret := h.GetCurrentClocksEventReasons()
			report("clock event reasons", ret, fmt.Sprintf("%#x (thermal %v, power brake %v)", reasons, reasons&(clocksSWThermal|clocksHWThermal) != 0, reasons&clocksPowerBrake != 0))
			events, ret := h.GetSupportedEventTypes()
			report("events", ret, fmt.Sprintf("%#x (XID %v, double-bit ECC %v, recovery action %v)", events,
				events&nvml.EventTypeXidCriticalError != 0, events&nvml.EventTypeDoubleBitEccError != 0, events&nvml.EventTypeGpuRecoveryAction != 0))
			if ret == nvml.SUCCESS && events&nvml.EventTypeXidCriticalError == 0 {
				t.Error("the GPU cannot tell XID events")
			}

			r := nvmlnode.ReadHealth(h)
			t.Logf("  monitor's reading: recovery %d (known %v), links up %v, NVLink errors %d, PCIe replays %d", r.RecoveryAction, r.RecoveryKnown, r.LinksUp, r.NVLinkErrors, r.PCIeReplays)
			for _, s := range r.Conditions {
				t.Logf("  holds: %s", table.Classify(s))
			}
			if r.Lost {
				t.Fatal("the GPU is lost")
			}
			if r.RecoveryKnown != recoveryKnown || (recoveryKnown && r.RecoveryAction != recovery) {
				t.Errorf("the monitor read recovery action %d (known %v), the field %d (known %v)", r.RecoveryAction, r.RecoveryKnown, recovery, recoveryKnown)
			}
			if links > 0 && fmt.Sprint(r.LinksUp) != fmt.Sprint(up) {
				t.Errorf("the monitor read links up %v, the calls %v", r.LinksUp, up)
			}
			if pending != r.Holds(node.SignalRowRemapPending) || failed != r.Holds(node.SignalRowRemapFailed) {
				t.Errorf("remapped rows pending %v failed %v, the monitor's conditions %v", pending, failed, r.Conditions)
			}
		})
	}
}
