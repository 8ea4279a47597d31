// scheduler.cpp: the fibers that run a block's threads (see cuda_host.h).
//
// Each thread of a block is a fiber with its own stack (a guard page below
// it), switched by a few instructions on x86-64 (the callee-saved registers,
// the SSE and x87 control words: no system call) and by ucontext elsewhere.
// The scheduler runs every runnable fiber in thread order (or reverse order,
// to expose a missing barrier the other way round) until it yields at a
// barrier or a warp intrinsic or returns; then it resolves one warp
// intrinsic or the block barrier, or reports why nothing can progress.

#include "cuda_host.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace gw_host {

thread_local Current* current = nullptr;

namespace {

#if defined(__x86_64__)
// gw_host_switch(&from_sp, to_sp): saves the callee-saved registers and the
// MXCSR and x87 control words on the current stack, stores its pointer in
// *from_sp, and resumes the stack to_sp as saved.
extern "C" void gw_host_switch(void** from_sp, void* to_sp);
asm(R"(
    .text
    .p2align 4
    .type gw_host_switch, @function
gw_host_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size gw_host_switch, .-gw_host_switch
)");

struct Context {
    void* sp = nullptr;
};

// Prepares `c` to start `entry` (which never returns) on `stack`.
void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
    uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t{15};
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;                               // entry's return address: none
    *--sp = reinterpret_cast<void*>(entry);        // gw_host_switch's ret
    for (int r = 0; r < 6; ++r) *--sp = nullptr;   // rbp rbx r12-r15
    unsigned control[2];
    asm volatile("stmxcsr %0" : "=m"(control[0]));
    asm volatile("fnstcw %0" : "=m"(control[1]));
    --sp;
    std::memcpy(sp, control, sizeof control);
    c.sp = sp;
}

void switch_context(Context& from, Context& to) { gw_host_switch(&from.sp, to.sp); }
#else
struct Context {
    ucontext_t uc;
};

void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}

void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

enum State { RUNNABLE, AT_BARRIER, AT_WARP, DONE };

struct Fiber {
    Context context;
    State state;
    int warp_op;
    unsigned warp_mask;
    unsigned long long warp_value;
    unsigned warp_result;
    Current position;
};

// The fiber stacks of this OS thread, kept between launches.
class Stacks {
  public:
    static constexpr size_t kStack = 128 * 1024;

    ~Stacks() {
        if (base_ != nullptr) munmap(base_, count_ * slot());
    }

    // The stack of fiber `i` (at most `count` fibers), or null.
    char* reserve(size_t count) {
        if (count > count_) {
            if (base_ != nullptr) munmap(base_, count_ * slot());
            void* p = mmap(nullptr, count * slot(), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) {
                base_ = nullptr;
                count_ = 0;
                return nullptr;
            }
            base_ = static_cast<char*>(p);
            count_ = count;
            for (size_t i = 0; i < count; ++i) {
                // The lowest page of each slot: an overflow faults.
                mprotect(base_ + i * slot(), page(), PROT_NONE);
            }
        }
        return base_;
    }

    static size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
    static size_t slot() { return kStack + page(); }

  private:
    char* base_ = nullptr;
    size_t count_ = 0;
};

thread_local Stacks stacks;

struct Block {
    Context scheduler;
    std::vector<Fiber> fibers;
    size_t running = 0;
    void (*body)(void* const*) = nullptr;
    void* const* args = nullptr;
    bool failed = false;
    Launch* launch = nullptr;
};

thread_local Block* block = nullptr;

// The `__shared__` variables this OS thread's launches have declared.
struct SharedVariable {
    void* at;
    unsigned long bytes;
};
thread_local std::vector<SharedVariable> shared_variables;

void fail(Block& b, const char* format, ...) __attribute__((format(printf, 2, 3)));

void fail(Block& b, const char* format, ...) {
    if (b.failed) return;
    b.failed = true;
    Launch& l = *b.launch;
    if (l.error == nullptr || l.error_len == 0) return;
    const Current& at = b.fibers[b.running].position;
    int used = std::snprintf(l.error, l.error_len, "block (%u, %u) thread %u: ",
                             at.block_idx.x, at.block_idx.y, at.thread_idx.x);
    if (used < 0) used = 0;
    if (static_cast<unsigned long>(used) < l.error_len) {
        va_list ap;
        va_start(ap, format);
        std::vsnprintf(l.error + used, l.error_len - used, format, ap);
        va_end(ap);
    }
}

// Yields the running fiber back to the scheduler.
void yield() {
    Block& b = *block;
    switch_context(b.fibers[b.running].context, b.scheduler);
}

// A fiber's first frame: runs the thread's kernel call, then hands back to
// the scheduler for good.
void fiber_main() {
    Block& b = *block;
    b.body(b.args);
    b.fibers[b.running].state = DONE;
    yield();
    std::abort();  // a finished fiber is never resumed
}

// Resolves one warp whose named lanes have all arrived. Returns 1 when one
// was released, 0 when none is ready, -1 on an error.
int resolve_warp(Block& b) {
    const size_t n = b.fibers.size();
    for (size_t w = 0; w * 32 < n; ++w) {
        size_t first = n;
        for (size_t l = w * 32; l < n && l < w * 32 + 32; ++l) {
            if (b.fibers[l].state == AT_WARP) {
                first = l;
                break;
            }
        }
        if (first == n) continue;
        const Fiber& lead = b.fibers[first];
        const unsigned mask = lead.warp_mask;
        bool ready = true;
        for (unsigned lane = 0; lane < 32; ++lane) {
            const size_t t = w * 32 + lane;
            const bool named = (mask >> lane) & 1u;
            if (t >= n) {
                if (named) {
                    b.running = first;
                    fail(b, "warp intrinsic's mask 0x%08x names lane %u past the block", mask, lane);
                    return -1;
                }
                continue;
            }
            const Fiber& f = b.fibers[t];
            if (f.state == AT_WARP && !((f.warp_mask >> lane) & 1u)) {
                b.running = t;
                fail(b, "warp intrinsic's mask 0x%08x leaves out the calling lane", f.warp_mask);
                return -1;
            }
            if (!named) continue;
            if (f.state == DONE) {
                b.running = t;
                fail(b, "exited before a warp intrinsic naming it (mask 0x%08x)", mask);
                return -1;
            }
            if (f.state != AT_WARP) {
                ready = false;
                continue;
            }
            if (f.warp_op != lead.warp_op || f.warp_mask != mask) {
                b.running = t;
                fail(b, "warp intrinsic %d mask 0x%08x while lane %zu is at %d mask 0x%08x",
                     f.warp_op, f.warp_mask, first - w * 32, lead.warp_op, mask);
                return -1;
            }
        }
        if (!ready) continue;
        unsigned ballot = 0;
        for (unsigned lane = 0; lane < 32; ++lane) {
            if ((mask >> lane) & 1u && b.fibers[w * 32 + lane].warp_value != 0) ballot |= 1u << lane;
        }
        for (unsigned lane = 0; lane < 32; ++lane) {
            if (!((mask >> lane) & 1u)) continue;
            Fiber& f = b.fibers[w * 32 + lane];
            if (lead.warp_op == WARP_BALLOT) {
                f.warp_result = ballot;
            } else {
                unsigned peers = 0;
                for (unsigned other = 0; other < 32; ++other) {
                    if ((mask >> other) & 1u &&
                        b.fibers[w * 32 + other].warp_value == f.warp_value) {
                        peers |= 1u << other;
                    }
                }
                f.warp_result = peers;
            }
        }
        for (unsigned lane = 0; lane < 32; ++lane) {
            if ((mask >> lane) & 1u) b.fibers[w * 32 + lane].state = RUNNABLE;
        }
        return 1;
    }
    return 0;
}

// Releases the block barrier once every thread is at it. Returns 1 when
// released, -1 on an error (a deadlock, a barrier after exits).
int resolve_barrier(Block& b) {
    size_t at_barrier = 0, done = 0, first_barrier = 0, stuck = b.fibers.size();
    for (size_t t = 0; t < b.fibers.size(); ++t) {
        switch (b.fibers[t].state) {
            case AT_BARRIER:
                if (at_barrier++ == 0) first_barrier = t;
                break;
            case DONE:
                ++done;
                break;
            default:
                if (stuck == b.fibers.size()) stuck = t;
                break;
        }
    }
    if (stuck != b.fibers.size()) {
        b.running = stuck;
        fail(b, "deadlock: waits at a warp intrinsic while %zu threads wait at __syncthreads",
             at_barrier);
        return -1;
    }
    if (done > 0) {
        b.running = first_barrier;
        fail(b, "__syncthreads reached after %zu of the block's %zu threads exited", done,
             b.fibers.size());
        return -1;
    }
    for (Fiber& f : b.fibers) f.state = RUNNABLE;
    return 1;
}

// Runs one block. Returns false on an error.
bool run_block(Block& b, char* stack_base, unsigned bx, unsigned by) {
    const size_t n = b.fibers.size();
    for (const SharedVariable& v : shared_variables) std::memset(v.at, 0xff, v.bytes);
    const Launch& l = *b.launch;
    for (size_t t = 0; t < n; ++t) {
        Fiber& f = b.fibers[t];
        f.state = RUNNABLE;
        f.position.thread_idx = Dim3{static_cast<unsigned>(t), 0, 0};
        f.position.block_idx = Dim3{bx, by, 0};
        f.position.block_dim = Dim3{l.block_x, 1, 1};
        f.position.grid_dim = Dim3{l.grid_x, l.grid_y, 1};
        make_context(f.context, stack_base + t * Stacks::slot() + Stacks::page(),
                     Stacks::kStack, fiber_main);
    }
    for (;;) {
        bool all_done = true;
        for (size_t k = 0; k < n; ++k) {
            const size_t t = l.reverse ? n - 1 - k : k;
            Fiber& f = b.fibers[t];
            if (f.state == RUNNABLE) {
                b.running = t;
                current = &f.position;
                switch_context(b.scheduler, f.context);
                current = nullptr;
                if (b.failed) return false;
            }
            all_done = all_done && f.state == DONE;
        }
        if (all_done) {
            // A fiber returned after the pass checked it: recheck.
            bool really = true;
            for (const Fiber& f : b.fibers) really = really && f.state == DONE;
            if (really) return true;
        }
        bool any_runnable = false;
        for (const Fiber& f : b.fibers) any_runnable = any_runnable || f.state == RUNNABLE;
        if (any_runnable) continue;
        const int warp = resolve_warp(b);
        if (warp < 0) return false;
        if (warp > 0) continue;
        bool all_exited = true;
        for (const Fiber& f : b.fibers) all_exited = all_exited && f.state == DONE;
        if (all_exited) return true;
        if (resolve_barrier(b) < 0) return false;
    }
}

}  // namespace

void shared_memory(void* p, unsigned long bytes) {
    for (const SharedVariable& v : shared_variables) {
        if (v.at == p) return;
    }
    shared_variables.push_back(SharedVariable{p, bytes});
    // First declared by the block running now, before any of its threads
    // could write it.
    std::memset(p, 0xff, bytes);
}

void sync_threads() {
    Block& b = *block;
    b.fibers[b.running].state = AT_BARRIER;
    yield();
}

unsigned warp_op(int op, unsigned mask, unsigned long long value) {
    Block& b = *block;
    Fiber& f = b.fibers[b.running];
    f.state = AT_WARP;
    f.warp_op = op;
    f.warp_mask = mask;
    f.warp_value = value;
    yield();
    return b.fibers[b.running].warp_result;
}

void trap(const char* why) {
    Block* b = block;
    if (b == nullptr) std::abort();
    fail(*b, "%s", why);
    yield();
    std::abort();  // never resumed
}

int run(Launch* launch, void (*body)(void* const* args), void* const* args) {
    Block b;
    b.launch = launch;
    b.body = body;
    b.args = args;
    if (launch->block_x == 0 || launch->block_x > 1024 || launch->grid_x == 0 ||
        launch->grid_y == 0) {
        b.fibers.resize(1);
        fail(b, "invalid launch: grid %u x %u, block %u", launch->grid_x, launch->grid_y,
             launch->block_x);
        return 1;
    }
    char* stack_base = stacks.reserve(launch->block_x);
    b.fibers.resize(launch->block_x);
    if (stack_base == nullptr) {
        fail(b, "cannot map %u fiber stacks", launch->block_x);
        return 1;
    }
    Block* outer = block;
    block = &b;
    bool ok = true;
    for (unsigned by = 0; ok && by < launch->grid_y; ++by) {
        for (unsigned bx = 0; ok && bx < launch->grid_x; ++bx) {
            ok = run_block(b, stack_base, bx, by);
        }
    }
    block = outer;
    return ok ? 0 : 1;
}

}  // namespace gw_host
