package chain

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/node"
)

// Recovered says what Recover did.
type Recovered struct {
	// Recovered are the known containers whose GPUs are held again and
	// whose rules are enforced again.
	Recovered []string
	// Cleaned are the containers of this isolator that no known container
	// explains (records, device cgroups), cleaned up as Cleanup does.
	Cleaned []string
	// Unknown are known containers the isolator has no record of: it
	// holds nothing for them, and they get no GPU (a device cgroup of
	// theirs under Parent is left to them with every GPU denied).
	Unknown []string
}

// Recover makes the isolator agree with the containers the agent still
// knows (known: their ids), after the agent restarted. For each known
// container it holds its GPUs again (the allocation its state directory
// kept, or, where that was lost, exactly the GPUs its record names) and
// enforces its rules again on its cgroup; everything of the isolator's own
// that no known container explains (a record, a device cgroup under
// Parent) is cleaned up. It touches nothing outside its state directory
// and its parent cgroup. Each container's failure is joined to the error
// and does not stop the others.
func (i *Isolator) Recover(ctx context.Context, known []string) (Recovered, error) {
	var res Recovered
	if err := i.made(); err != nil {
		return res, err
	}
	for _, id := range known {
		if err := node.ValidateOwner(id); err != nil {
			return res, fmt.Errorf("recover: %w", err)
		}
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	ids, err := i.ids()
	if err != nil {
		return res, fmt.Errorf("recover: %w", err)
	}
	var errs []error
	var failed []string
	for _, id := range slices.Sorted(slices.Values(known)) {
		rec, err := i.read(id)
		switch {
		case errors.Is(err, ErrUnknownContainer):
			res.Unknown = append(res.Unknown, id)
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("recover %s: %w", id, err))
			continue
		case rec.Phase != phasePrepared:
			// Prepare never returned: the agent cannot have launched it.
			continue
		}
		if err := i.readopt(ctx, rec); err != nil {
			// It keeps running, for the agent to decide, but with no GPU
			// the isolator cannot hold for it.
			parent, name := i.target(rec)
			rules, rerr := i.rulesFor(id, nil)
			if rerr == nil {
				rerr = i.dev.Apply(ctx, parent, name, rules)
			}
			errs = append(errs, fmt.Errorf("recover %s: %w", id, errors.Join(err, rerr)))
			failed = append(failed, id)
			continue
		}
		res.Recovered = append(res.Recovered, id)
	}
	owners, err := i.dev.Owners(ctx, i.parent)
	if err != nil {
		errs = append(errs, fmt.Errorf("recover: %w", err))
	}
	for _, id := range slices.Compact(slices.Sorted(slices.Values(append(ids, owners...)))) {
		if slices.Contains(res.Recovered, id) || slices.Contains(failed, id) {
			continue
		}
		if slices.Contains(res.Unknown, id) {
			// A device cgroup of a container the agent knows and the
			// isolator holds nothing for: it keeps running, denied every
			// GPU, for the agent to decide.
			if err := i.denyGPUs(ctx, id); err != nil {
				errs = append(errs, fmt.Errorf("recover %s: %w", id, err))
			}
			continue
		}
		if err := i.cleanup(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("recover: clean up %s: %w", id, err))
			continue
		}
		res.Cleaned = append(res.Cleaned, id)
	}
	if i.mps != nil {
		// Daemons no record or memory share explains: a share released
		// past the isolator, or a Prepare killed before its record.
		keep := mps.Keep{Shares: i.alloc, Recorded: func(owner string) bool {
			_, err := i.read(owner)
			return err == nil
		}}
		if _, err := i.mps.Sweep(ctx, keep.Keeps); err != nil {
			errs = append(errs, fmt.Errorf("recover: %w", err))
		}
	}
	if len(res.Recovered)+len(res.Cleaned) > 0 {
		i.log.Info("recovered gpu isolation", "recovered", res.Recovered, "cleaned", res.Cleaned, "unknown", res.Unknown)
	}
	return res, errors.Join(errs...)
}

// readopt holds rec's GPUs again and enforces its rules again.
func (i *Isolator) readopt(ctx context.Context, rec held) error {
	claim := make([]node.DeviceRef, len(rec.GPUs))
	for k, u := range rec.GPUs {
		claim[k] = node.DeviceRef{UUID: u}
	}
	// Exactly the recorded GPUs (or share), where the allocator's state
	// lost them.
	var opts []allocator.ClaimOption
	if rec.Share != nil && len(claim) == 1 {
		opts = append(opts, allocator.AsShare(*rec.Share))
	}
	al, err := i.alloc.Claim(ctx, rec.ID, claim, opts...)
	if errors.Is(err, allocator.ErrClaimMismatch) {
		// An update was cut short after the allocator changed: the
		// allocator's state is the newer one.
		al, err = i.alloc.Allocation(rec.ID)
	}
	if err != nil {
		return err
	}
	if got := uuids(al.Devices); !slices.Equal(got, rec.GPUs) {
		rec.GPUs = got
		if err := i.write(rec); err != nil {
			return err
		}
	}
	if rec.Volume != "" && i.vols != nil {
		if err := i.vols.Acquire(ctx, rec.Volume, rec.ID); err != nil {
			return err
		}
	}
	if i.mps != nil {
		// A memory share's daemon, running (Start is idempotent), or
		// started again in place.
		if _, err := i.mps.StartShare(ctx, al); err != nil {
			return err
		}
	}
	plan, err := i.planFor(rec.ID, al.Devices)
	if err != nil {
		return err
	}
	parent, name := i.target(rec)
	return i.enforce(ctx, parent, name, plan, rec.Cgroup != "")
}

// denyGPUs leaves id's own device cgroup only the rules of a container
// without GPUs.
func (i *Isolator) denyGPUs(ctx context.Context, id string) error {
	rules, err := i.rulesFor(id, nil)
	if err != nil {
		return err
	}
	return i.dev.Apply(ctx, i.parent, id, rules)
}
