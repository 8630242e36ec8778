#pragma once
// runtime::RunSlots — this node's run slots: how many runs execute here at once, in total
// (max_concurrent_runs) and per tenant (tenant_max_running), so that one tenant's runs cannot
// take every slot and leave the others' queued behind them (DESIGN.md invariant 13).
//
// A run takes its slot before it is claimed (by intake or the dispatcher) and holds it, as a
// Hold, until its execution's work is over (its ending is queued for the writer, or the
// execution stops); dropping a Hold gives the slot back. On PostgreSQL with
// several nodes each node counts its own slots: a tenant's share is per node.
//
// Owned by the Runtime; used on its io executor only (no lock).

#include <map>
#include <string>

namespace keel::runtime {

class RunSlots {
 public:
  // A slot taken for one of a tenant's runs; empty (false) when none was free.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& other) noexcept { *this = std::move(other); }
    Hold& operator=(Hold&& other) noexcept {
      if (this != &other) {
        Release();
        slots_ = other.slots_;
        tenant_ = std::move(other.tenant_);
        other.slots_ = nullptr;
      }
      return *this;
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { Release(); }
    explicit operator bool() const { return slots_ != nullptr; }
    void Release() {
      if (slots_) slots_->Give(tenant_);
      slots_ = nullptr;
    }

   private:
    friend class RunSlots;
    Hold(RunSlots* slots, std::string tenant) : slots_(slots), tenant_(std::move(tenant)) {}
    RunSlots* slots_ = nullptr;
    std::string tenant_;
  };

  // REQUIRES: 1 <= per_tenant <= total.
  RunSlots(int total, int per_tenant) : total_(total), per_tenant_(per_tenant) {}
  RunSlots(const RunSlots&) = delete;
  RunSlots& operator=(const RunSlots&) = delete;

  // A slot for one of `tenant`'s runs, or an empty Hold when the node is full or the tenant
  // holds its share already.
  Hold Take(const std::string& tenant) {
    if (used_ >= total_) return Hold();
    int& mine = by_tenant_[tenant];
    if (mine >= per_tenant_) return Hold();
    ++mine;
    ++used_;
    return Hold(this, tenant);
  }
  int free() const { return total_ - used_; }

 private:
  void Give(const std::string& tenant) {
    --used_;
    auto it = by_tenant_.find(tenant);
    if (--it->second == 0) by_tenant_.erase(it);
  }

  const int total_;
  const int per_tenant_;
  int used_ = 0;
  std::map<std::string, int> by_tenant_;  // tenants holding slots, and how many
};

}  // namespace keel::runtime
