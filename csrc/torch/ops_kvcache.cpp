// The CUDA implementation of flash_attn::fwd_kvcache (schema in flash_attn/ops.py): checks,
// allocation, params and launch of the append + split-KV + combine kernels (launch_kvcache.cuh).
// k_cache and v_cache are written in place at cache_seqlens when new keys are given, so they are
// never copied: a cache the kernels cannot address in place is an error.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "flash/features.h"
#include "flash/splitkv_heuristic.h"
#include "op_common.h"

namespace {

using namespace flash_attn_op;
using OptionalTensor = c10::optional<at::Tensor>;

constexpr int kPageMultiple = 16;  // the split-KV kernel's key steps never straddle a page mid-row

// Runs the compiled (dtype, head dim) kvcache kernels; the caller checked that they exist.
cudaError_t launch_kvcache(at::ScalarType dtype, int headdim, const flash::KvAppendParams& append,
                           const flash::SplitKvParams& params, cudaStream_t stream) {
#define FLASH_ATTN_TRY(T, D) \
  if (scalar_type_of<T>() == dtype && (D) == headdim) return flash::run_fwd_kvcache<T, D>(append, params, stream);
  FLASH_ATTN_FOR_EACH_CONFIG(FLASH_ATTN_TRY)
#undef FLASH_ATTN_TRY
  return cudaErrorInvalidValue;
}

void check_metadata(const at::Tensor& t, const char* name, const at::Tensor& q, int64_t dims) {
  TORCH_CHECK(t.is_cuda() && t.device() == q.device(), "flash_attn: ", name, " must be on q's device");
  TORCH_CHECK(t.scalar_type() == at::kInt, "flash_attn: ", name, " must be int32, got ", c10::toString(t.scalar_type()));
  TORCH_CHECK(t.dim() == dims && t.stride(-1) == 1, "flash_attn: ", name, " must have ", text(dims),
              " dims and a contiguous last dim, got ", text(t.sizes()));
}

void check_batch_vector(const OptionalTensor& t, const char* name, const at::Tensor& q) {
  if (!t.has_value()) return;
  check_metadata(*t, name, q, 1);
  TORCH_CHECK(t->size(0) == q.size(0), "flash_attn: ", name, " must have shape (batch,) = (", text(q.size(0)),
              ",), got ", text(t->sizes()));
}

// q (b, sq, h, d); caches (entries or pages, rows, hk, d) in place; returns the compiled head dim.
int check_tensors(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache) {
  check_cuda_4d(q, "q");
  check_cuda_4d(k_cache, "k_cache");
  check_cuda_4d(v_cache, "v_cache");
  check_last_dim_contiguous(q, "q");
  TORCH_CHECK(k_cache.device() == q.device() && v_cache.device() == q.device(),
              "flash_attn: q, k_cache and v_cache must be on one device");
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16, "flash_attn: q must be float16 or bfloat16, got ",
              c10::toString(dtype));
  TORCH_CHECK(k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype,
              "flash_attn: k_cache and v_cache must have q's dtype ", c10::toString(dtype));
  check_same_shape(v_cache, k_cache, "v_cache", "k_cache");
  const int64_t headdim = q.size(3);
  TORCH_CHECK(k_cache.size(3) == headdim, "flash_attn: k_cache has head dim ", text(k_cache.size(3)),
              " but q has ", text(headdim));
  TORCH_CHECK(headdim > 0 && headdim <= kMaxHeaddim && headdim % kRowAlignment == 0,
              "flash_attn: head dim must be a multiple of 8 in [8, 256] (the public function pads), got ", text(headdim));
  TORCH_CHECK(k_cache.size(2) > 0 && q.size(2) % k_cache.size(2) == 0, "flash_attn: nheads of q (", text(q.size(2)),
              ") must be a multiple of nheads of k_cache (", text(k_cache.size(2)), ")");
  TORCH_CHECK(kernel_ready(k_cache) && kernel_ready(v_cache),
              "flash_attn: k_cache and v_cache are updated in place, so they must be addressable as they are: "
              "a contiguous last dim, every other stride a multiple of 8 elements and a 16-byte aligned start; got "
              "strides ", text(k_cache.strides()), " and ", text(v_cache.strides()));
  TORCH_CHECK(q.size(0) <= kMaxGridYZ && k_cache.size(2) <= kMaxGridYZ, "flash_attn: batch and nheads_k must be <= ",
              text(kMaxGridYZ));
  const auto* props = at::cuda::getDeviceProperties(q.get_device());
  TORCH_CHECK(props->major >= 8, "flash_attn: ", props->name, " has compute capability ", text(props->major), ".",
              text(props->minor), "; flash_attn needs sm80 (Ampere) or newer");
  const int kernel_hd = kernel_headdim(dtype, static_cast<int>(headdim));
  TORCH_CHECK(kernel_hd > 0, "flash_attn: this build has no ", c10::toString(dtype), " kernel for head dim ",
              text(headdim), " (built with FLASH_ATTN_DTYPES=\"", FLASH_ATTN_BUILD_DTYPES, "\" FLASH_ATTN_HDIMS=\"",
              FLASH_ATTN_BUILD_HDIMS, "\"); rebuild to include it");
  return kernel_hd;
}

// The cache layout: contiguous (entries, capacity, hk, d) or paged (pages, page_size, hk, d).
flash::KvCacheArgs cache_args(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& cache_seqlens,
                              const OptionalTensor& cache_batch_idx, const OptionalTensor& cache_leftpad,
                              const OptionalTensor& block_table) {
  check_batch_vector(cache_seqlens, "cache_seqlens", q);
  check_batch_vector(cache_batch_idx, "cache_batch_idx", q);
  check_batch_vector(cache_leftpad, "cache_leftpad", q);
  flash::KvCacheArgs c{};
  c.cache_seqlens = cache_seqlens.data_ptr<int>();
  c.cache_batch_idx = cache_batch_idx.has_value() ? cache_batch_idx->data_ptr<int>() : nullptr;
  c.leftpad = cache_leftpad.has_value() ? cache_leftpad->data_ptr<int>() : nullptr;
  c.entries = static_cast<int>(k_cache.size(0));
  TORCH_CHECK(k_cache.size(0) <= std::numeric_limits<int>::max() && k_cache.size(1) <= std::numeric_limits<int>::max(),
              "flash_attn: k_cache is too large");
  if (!block_table.has_value()) {
    TORCH_CHECK(cache_batch_idx.has_value() || k_cache.size(0) >= q.size(0), "flash_attn: k_cache has ",
                text(k_cache.size(0)), " batch entries but q has batch ", text(q.size(0)), "; pass cache_batch_idx "
                "to choose entries");
    c.capacity = static_cast<int>(k_cache.size(1));
    c.page_size = c.capacity;
    c.page_shift = -1;
    return c;
  }
  check_metadata(*block_table, "block_table", q, 2);
  TORCH_CHECK(block_table->size(0) == q.size(0), "flash_attn: block_table must have shape (batch, max_pages) with "
              "batch = ", text(q.size(0)), ", got ", text(block_table->sizes()));
  TORCH_CHECK(!cache_batch_idx.has_value(), "flash_attn: cache_batch_idx cannot be used with block_table (a paged "
              "cache chooses its pages per batch entry through block_table)");
  const int64_t page_size = k_cache.size(1);
  TORCH_CHECK(page_size > 0 && page_size % kPageMultiple == 0, "flash_attn: the paged cache's page size (k_cache.size(1)) "
              "must be a multiple of 16, got ", text(page_size));
  TORCH_CHECK(block_table->size(1) > 0 && k_cache.size(0) > 0, "flash_attn: block_table and the paged cache must be "
              "non-empty");
  TORCH_CHECK(block_table->size(1) * page_size <= std::numeric_limits<int>::max(), "flash_attn: block_table spans too "
              "many positions");
  c.block_table = block_table->data_ptr<int>();
  c.block_table_stride = block_table->stride(0);
  c.max_pages = static_cast<int>(block_table->size(1));
  c.page_size = static_cast<int>(page_size);
  c.page_shift = (page_size & (page_size - 1)) == 0 ? static_cast<int>(std::log2(static_cast<double>(page_size))) : -1;
  c.capacity = static_cast<int>(block_table->size(1) * page_size);
  return c;
}

// rotary_cos / rotary_sin (seqlen_ro, rotary_dim / 2), q's dtype, at least `capacity` rows.
flash::RotaryArgs rotary_args(const at::Tensor& q, const OptionalTensor& cos, const OptionalTensor& sin,
                              bool interleaved, bool per_token, int capacity) {
  flash::RotaryArgs r{};
  TORCH_CHECK(cos.has_value() == sin.has_value(), "flash_attn: rotary_cos and rotary_sin are given together");
  if (!cos.has_value()) return r;
  for (const auto* t : {&*cos, &*sin}) {
    TORCH_CHECK(t->is_cuda() && t->device() == q.device(), "flash_attn: rotary_cos / rotary_sin must be on q's device");
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "flash_attn: rotary_cos / rotary_sin must have q's dtype");
    TORCH_CHECK(t->dim() == 2 && t->is_contiguous(), "flash_attn: rotary_cos / rotary_sin must be contiguous "
                "(seqlen_ro, rotary_dim / 2), got ", text(t->sizes()));
  }
  check_same_shape(*sin, *cos, "rotary_sin", "rotary_cos");
  const int64_t rotary_dim = 2 * cos->size(1);
  TORCH_CHECK(rotary_dim > 0 && rotary_dim <= q.size(3) && rotary_dim % 16 == 0, "flash_attn: rotary_dim "
              "(2 * rotary_cos.size(1)) must be a multiple of 16 and at most the head dim ", text(q.size(3)), ", got ",
              text(rotary_dim));
  TORCH_CHECK(cos->size(0) >= capacity, "flash_attn: rotary_cos / rotary_sin need a row per cache position: at least ",
              text(capacity), " rows, got ", text(cos->size(0)));
  r.cos = cos->data_ptr();
  r.sin = sin->data_ptr();
  r.rotary_dim = static_cast<int>(rotary_dim);
  r.seqlen_ro = static_cast<int>(cos->size(0));
  r.interleaved = interleaved;
  r.q_positions_per_token = per_token;
  return r;
}

void check_new_tokens(const OptionalTensor& k, const OptionalTensor& v, const at::Tensor& q,
                      const at::Tensor& k_cache) {
  TORCH_CHECK(k.has_value() == v.has_value(), "flash_attn: k and v (the new tokens) are given together");
  if (!k.has_value()) return;
  check_cuda_4d(*k, "k");
  check_cuda_4d(*v, "v");
  check_same_shape(*v, *k, "v", "k");
  TORCH_CHECK(k->device() == q.device() && v->device() == q.device(), "flash_attn: k and v must be on q's device");
  TORCH_CHECK(k->scalar_type() == q.scalar_type() && v->scalar_type() == q.scalar_type(),
              "flash_attn: k and v must have q's dtype");
  TORCH_CHECK(k->size(0) == q.size(0) && k->size(2) == k_cache.size(2) && k->size(3) == q.size(3),
              "flash_attn: k and v must have shape (batch, seqlen_new, nheads_k, headdim) = (", text(q.size(0)),
              ", seqlen_new, ", text(k_cache.size(2)), ", ", text(q.size(3)), "), got ", text(k->sizes()));
  TORCH_CHECK(k->size(1) <= std::numeric_limits<int>::max(), "flash_attn: seqlen_new is too large");
}

// The score options shared with the training forward (window, softcap, ALiBi).
void fill_score_options(flash::FwdParams& p, const at::Tensor& q, int64_t window_left, int64_t window_right,
                        double softcap, const OptionalTensor& alibi_slopes, double softmax_scale) {
  check_feature(softcap > 0, flash::kSoftcapCompiled, "softcap", "FLASH_ATTN_DISABLE_SOFTCAP");
  check_feature(alibi_slopes.has_value(), flash::kAlibiCompiled, "alibi_slopes", "FLASH_ATTN_DISABLE_ALIBI");
  check_feature(window_left >= 0 || window_right > 0, flash::kLocalCompiled, "window_size (local attention)",
                "FLASH_ATTN_DISABLE_LOCAL");
  TORCH_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0, "flash_attn: softmax_scale must be positive and "
              "finite, got ", std::to_string(softmax_scale));
  TORCH_CHECK(softcap >= 0 && std::isfinite(softcap), "flash_attn: softcap must be >= 0, got ", std::to_string(softcap));
  TORCH_CHECK(window_left >= -1 && window_right >= -1, "flash_attn: window_size entries must be >= -1");
  p.window = {static_cast<int>(window_left), static_cast<int>(window_right)};
  p.causal = window_right == 0;
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.score_mod.softcap = static_cast<float>(softcap);
  if (alibi_slopes.has_value()) {
    const auto& a = *alibi_slopes;
    TORCH_CHECK(a.is_cuda() && a.device() == q.device() && a.scalar_type() == at::kFloat,
                "flash_attn: alibi_slopes must be float32 on q's device");
    const bool per_head = a.dim() == 1 && a.size(0) == q.size(2);
    const bool per_batch_head = a.dim() == 2 && a.size(0) == q.size(0) && a.size(1) == q.size(2);
    TORCH_CHECK((per_head || per_batch_head) && a.stride(-1) == 1, "flash_attn: alibi_slopes must be (nheads,) or "
                "(batch, nheads) with a contiguous last dim, got ", text(a.sizes()));
    p.score_mod.alibi_slopes = a.data_ptr<float>();
    p.score_mod.alibi_batch_stride = a.dim() == 2 ? a.stride(0) : 0;
  }
  p.logit_scale = softcap > 0 ? static_cast<float>(softcap) : p.softmax_scale;
  p.logit_scale_log2 = static_cast<float>(p.logit_scale * M_LOG2E);
  p.dropout.keep_prob = 1.f;
}

std::tuple<at::Tensor, at::Tensor> mha_fwd_kvcache(
    const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache, const OptionalTensor& k_in,
    const OptionalTensor& v_in, const OptionalTensor& rotary_cos, const OptionalTensor& rotary_sin,
    const at::Tensor& cache_seqlens, const OptionalTensor& cache_batch_idx, const OptionalTensor& cache_leftpad,
    const OptionalTensor& block_table, double softmax_scale, int64_t window_left, int64_t window_right, double softcap,
    bool rotary_interleaved, const OptionalTensor& alibi_slopes, int64_t num_splits) {
  const int kernel_hd = check_tensors(q_in, k_cache, v_cache);
  check_new_tokens(k_in, v_in, q_in, k_cache);
  TORCH_CHECK(num_splits >= 0, "flash_attn: num_splits must be >= 0 (0: chosen by a heuristic), got ",
              text(num_splits));
  const c10::cuda::CUDAGuard guard(q_in.device());
  const auto q = kernel_ready_copy(q_in);
  const int64_t batch = q.size(0), seqlen_q = q.size(1), heads = q.size(2), headdim = q.size(3);
  const int64_t heads_k = k_cache.size(2);

  flash::SplitKvParams p{};
  p.cache = cache_args(q, k_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table);
  fill_score_options(p.fwd, q, window_left, window_right, softcap, alibi_slopes, softmax_scale);
  flash::KvAppendParams append{};
  append.rotary = rotary_args(q, rotary_cos, rotary_sin, rotary_interleaved, window_left >= 0 || window_right >= 0,
                              p.cache.capacity);
  at::Tensor k_new, v_new;
  if (k_in.has_value()) {
    k_new = kernel_ready_copy(*k_in);
    v_new = kernel_ready_copy(*v_in);
    append.k_new = strided(k_new);
    append.v_new = strided(v_new);
    p.cache.seqlen_new = static_cast<int>(k_new.size(1));
  }
  p.rotary = append.rotary;
  append.k_cache = strided(k_cache);
  append.v_cache = strided(v_cache);
  append.cache = p.cache;
  append.shape = {static_cast<int>(batch), static_cast<int>(seqlen_q), p.cache.capacity, static_cast<int>(heads),
                  static_cast<int>(heads_k), static_cast<int>(headdim)};

  auto out = at::empty(q.sizes(), q.options());
  auto lse = at::empty({batch, heads, seqlen_q}, q.options().dtype(at::kFloat));
  poison({out, lse});
  p.fwd.q = strided(q);
  p.fwd.k = strided(k_cache);
  p.fwd.v = strided(v_cache);
  p.fwd.out = strided(out);
  p.fwd.lse = lse.data_ptr<float>();
  p.fwd.lse_head_stride = seqlen_q;
  p.fwd.shape = append.shape;
  if (batch == 0) return {out, lse};
  const int64_t m_blocks = flash::splitkv_m_blocks(seqlen_q, heads / heads_k);
  const int num_sms = at::cuda::getDeviceProperties(q.get_device())->multiProcessorCount;
  p.num_splits = num_splits > 0 ? static_cast<int>(std::min<int64_t>(num_splits, flash::kMaxSplits))
                                : flash::choose_num_splits(batch * heads_k * m_blocks,
                                                           num_sms * flash::splitkv_ctas_per_sm(kernel_hd),
                                                           p.cache.capacity);
  at::Tensor out_accum, lse_accum;
  if (p.num_splits > 1) {
    out_accum = at::empty({p.num_splits, batch, heads, seqlen_q, headdim}, q.options().dtype(at::kFloat));
    lse_accum = at::empty({p.num_splits, batch, heads, seqlen_q}, q.options().dtype(at::kFloat));
    p.out_accum = out_accum.data_ptr<float>();
    p.lse_accum = lse_accum.data_ptr<float>();
  }
  p.headdim_accum = static_cast<int>(headdim);
  TORCH_CHECK(m_blocks * p.num_splits <= std::numeric_limits<int>::max(), "flash_attn: seqlen_q is too large");
  const cudaError_t err = launch_kvcache(q.scalar_type(), kernel_hd, append, p, at::cuda::getCurrentCUDAStream());
  check_launch(err, "kvcache", q.scalar_type(), kernel_hd);
  return {out, lse};
}

}  // namespace

TORCH_LIBRARY_IMPL(flash_attn, CUDA, m) { m.impl("fwd_kvcache", &mha_fwd_kvcache); }
