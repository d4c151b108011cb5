// examples/llama_cpp/llama_state.hpp
//
// llama.cpp's sequence state (llama_state_seq_get_data_ext / set_data_ext) as the cache
// stores it: per token, its position, its token id and, per attention layer, its K and V rows;
// per checkpoint, the recurrent part's rows. The byte layout is docs/llama_cpp.md's "llama.cpp's
// sequence state, as read from its sources" (written from llama.cpp's state_write/state_read,
// in our own words and code): a 4-byte magic and the sequence id, then for a hybrid memory the
// attention part (only without PARTIAL_ONLY) and the recurrent part.
//
//   state_layout     what the context writes: attention layers, K/V types and row sizes,
//                    whether V is transposed (no flash attention), whether cells carry the
//                    M-RoPE extra (x, y, token); recurrent layers and their row sizes. Learned
//                    once from a probe state (`learn_layout`).
//   read_full_state  a whole sequence state -> per-cell positions and per-layer K/V row
//                    pointers (cells in cell order; a fresh sequence in its own stream has them
//                    in position order) and the recurrent part.
//   write_full_state tokens [0, n) (rows from a callback) + a recurrent snapshot -> the buffer
//                    set_data_ext takes: tokens in position order, so llama.cpp places them in
//                    cells 0..n-1 of the sequence's own stream, exactly where a prefill would.
//
// Costs: every call is one pass over the bytes it reads or writes. Errors (a buffer that does
// not parse, a layout that changed) throw hybridcache::invalid_argument with what differed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/core/error.hpp"

namespace hybridcache_llama {

inline constexpr std::uint32_t state_magic = 0xaf143cd8u;

/// One attention layer's rows in a state.
struct kv_layer_layout {
  std::int32_t k_type = 0;
  std::uint64_t k_row = 0;  ///< bytes of one cell's K
  std::int32_t v_type = 0;
  std::uint64_t v_row = 0;  ///< bytes of one cell's V (v_el * n_embd_v when transposed)
  std::uint32_t v_el = 0;   ///< transposed V: bytes of one element
  std::uint32_t v_n = 0;    ///< transposed V: elements per cell
  [[nodiscard]] std::uint64_t token_bytes() const noexcept { return k_row + v_row; }
};

/// One recurrent layer's rows (conv state, then SSM state).
struct rec_layer_layout {
  std::int32_t r_type = 0;
  std::uint64_t r_row = 0;
  std::int32_t s_type = 0;
  std::uint64_t s_row = 0;
  [[nodiscard]] std::uint64_t bytes() const noexcept { return r_row + s_row; }
};

/// What a context's sequence states look like (fixed by the model and the context params).
struct state_layout {
  std::uint32_t streams = 1;     ///< KV streams (n_seq_max without kv_unified)
  bool cell_ext = false;         ///< cells carry (x, y, token) (M-RoPE)
  bool v_trans = false;          ///< V transposed (no flash attention)
  std::vector<kv_layer_layout> kv;
  std::uint32_t model_layers = 0;  ///< the recurrent part's layer count (all layers)
  std::vector<rec_layer_layout> rec;
  /// Bytes of one token's KV over all attention layers.
  [[nodiscard]] std::uint64_t kv_token_bytes() const noexcept {
    std::uint64_t b = 0;
    for (const auto& l : kv) b += l.token_bytes();
    return b;
  }
  /// Bytes of a recurrent snapshot's rows (no framing).
  [[nodiscard]] std::uint64_t rec_bytes() const noexcept {
    std::uint64_t b = 0;
    for (const auto& l : rec) b += l.bytes();
    return b;
  }
};

namespace detail {
class reader {
 public:
  explicit reader(std::span<const std::byte> b) : b_(b) {}
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  const std::byte* take(std::uint64_t n, const char* what) {
    need(n, what);
    const std::byte* p = b_.data() + at_;
    at_ += n;
    return p;
  }
  [[nodiscard]] std::size_t at() const noexcept { return at_; }
  [[nodiscard]] bool done() const noexcept { return at_ == b_.size(); }

 private:
  void need(std::uint64_t n, const char* what) const {
    if (n > b_.size() - at_)
      throw hybridcache::invalid_argument(std::string("llama state: truncated at ") + what + " (offset " +
                                          std::to_string(at_) + " of " + std::to_string(b_.size()) + ")");
  }
  std::span<const std::byte> b_;
  std::size_t at_ = 0;
};

class writer {
 public:
  explicit writer(std::vector<std::byte>& out) : out_(out) {}
  template <class T>
  void put(T v) {
    const auto n = out_.size();
    out_.resize(n + sizeof(T));
    std::memcpy(out_.data() + n, &v, sizeof(T));
  }
  std::byte* grow(std::uint64_t n) {
    const auto at = out_.size();
    out_.resize(at + n);
    return out_.data() + at;
  }

 private:
  std::vector<std::byte>& out_;
};

inline void expect(bool ok, const std::string& what) {
  if (!ok) throw hybridcache::invalid_argument("llama state: " + what);
}
}  // namespace detail

/// A whole sequence state, read in place: cells and row pointers into the buffer.
struct full_state_view {
  std::vector<std::int32_t> pos;          ///< per cell
  std::vector<std::int32_t> token;        ///< per cell (cell_ext only)
  /// K row of cell c in layer l: k[l] + c * k_row. V likewise unless transposed: element j of
  /// cell c is v[l] + (j * cells + c) * v_el.
  std::vector<const std::byte*> k, v;
  std::int32_t rec_pos = -1;              ///< the recurrent state's last position (-1: none)
  /// Per recurrent layer: the conv row and the SSM row.
  std::vector<const std::byte*> r, s;
};

/// Parses the recurrent part at `rd` (after the attention part, or right after the header
/// of a PARTIAL_ONLY state), checking it against `layout` (or filling it when `learn`).
inline void read_recurrent(detail::reader& rd, state_layout& layout, bool learn, full_state_view& out) {
  const auto cells = rd.get<std::uint32_t>("recurrent cell count");
  detail::expect(cells <= 1, "a sequence state holds at most one recurrent cell, got " + std::to_string(cells));
  out.rec_pos = -1;
  if (cells == 1) {
    out.rec_pos = rd.get<std::int32_t>("recurrent pos");
    const auto n_seq = rd.get<std::uint32_t>("recurrent n_seq_id");
    for (std::uint32_t i = 0; i < n_seq; ++i) (void)rd.get<std::int32_t>("recurrent seq id");
  }
  if (cells == 0) return;
  const auto s_trans = rd.get<std::uint32_t>("s_trans");
  detail::expect(s_trans == 0, "a transposed recurrent state is not supported");
  const auto n_layer = rd.get<std::uint32_t>("recurrent n_layer");
  if (learn) layout.model_layers = n_layer;
  detail::expect(n_layer == layout.model_layers, "the recurrent part's layer count changed");
  // Conv rows of every recurrent layer, then SSM rows: the number of recurrent layers is
  // learned from the first state (rows appear only for them).
  out.r.clear();
  out.s.clear();
  if (learn) {
    // Rows until the SSM rows start: a row's header repeats (type, size); the conv rows come
    // first, all with the conv row size, then the SSM rows with theirs.
    std::vector<std::pair<std::int32_t, std::uint64_t>> heads;
    std::vector<const std::byte*> rows;
    while (!rd.done()) {
      const auto t = rd.get<std::int32_t>("row type");
      const auto sz = rd.get<std::uint64_t>("row size");
      heads.emplace_back(t, sz);
      rows.push_back(rd.take(sz, "row"));
    }
    detail::expect(heads.size() % 2 == 0 && !heads.empty(), "an odd number of recurrent rows");
    const std::size_t n = heads.size() / 2;
    layout.rec.assign(n, {});
    for (std::size_t i = 0; i < n; ++i) {
      layout.rec[i] = {heads[i].first, heads[i].second, heads[n + i].first, heads[n + i].second};
      out.r.push_back(rows[i]);
      out.s.push_back(rows[n + i]);
    }
    return;
  }
  for (const auto& l : layout.rec) {
    detail::expect(rd.get<std::int32_t>("conv type") == l.r_type && rd.get<std::uint64_t>("conv row") == l.r_row,
                   "a conv row's type or size changed");
    out.r.push_back(rd.take(l.r_row, "conv row"));
  }
  for (const auto& l : layout.rec) {
    detail::expect(rd.get<std::int32_t>("ssm type") == l.s_type && rd.get<std::uint64_t>("ssm row") == l.s_row,
                   "an SSM row's type or size changed");
    out.s.push_back(rd.take(l.s_row, "ssm row"));
  }
}

/// Reads a whole sequence state (no flags) into `out`, checking it against `layout` (or
/// learning the attention and recurrent parts of `layout` when `learn`: then
/// `layout.cell_ext` must already say whether cells carry the extra). The stream holding the
/// sequence is the only one with cells.
inline void read_full_state(std::span<const std::byte> buf, state_layout& layout, bool learn, full_state_view& out) {
  detail::reader rd(buf);
  detail::expect(rd.get<std::uint32_t>("magic") == state_magic, "bad magic (not a sequence state of this llama.cpp)");
  (void)rd.get<std::int32_t>("seq id");
  const auto streams = rd.get<std::uint32_t>("stream count");
  if (learn) layout.streams = streams;
  detail::expect(streams == layout.streams, "the stream count changed");
  bool found = false;
  out.pos.clear();
  out.token.clear();
  for (std::uint32_t st = 0; st < streams; ++st) {
    const auto n = rd.get<std::uint32_t>("cell count");
    if (n == 0) continue;
    detail::expect(!found, "the sequence has cells in two streams");
    found = true;
    for (std::uint32_t c = 0; c < n; ++c) {  // pos, n_seq_id (1), [x, y, token], seq id
      out.pos.push_back(rd.get<std::int32_t>("cell pos"));
      detail::expect(rd.get<std::uint32_t>("cell n_seq_id") == 1, "a cell of a sequence state names one sequence");
      if (layout.cell_ext) {
        (void)rd.get<std::int32_t>("cell x");
        (void)rd.get<std::int32_t>("cell y");
        out.token.push_back(rd.get<std::int32_t>("cell token"));
      }
      (void)rd.get<std::int32_t>("cell seq id");
    }
    const auto v_trans = rd.get<std::uint32_t>("v_trans");
    const auto n_layer = rd.get<std::uint32_t>("attention n_layer");
    detail::expect(v_trans <= 1 && n_layer < 4096, "implausible v_trans or layer count");
    if (learn) {
      layout.v_trans = v_trans != 0;
      layout.kv.assign(n_layer, {});
    }
    detail::expect((v_trans != 0) == layout.v_trans, "v_trans changed (flash attention on in one context, off in another)");
    detail::expect(n_layer == layout.kv.size(), "the attention layer count changed");
    out.k.assign(n_layer, nullptr);
    out.v.assign(n_layer, nullptr);
    for (std::uint32_t l = 0; l < n_layer; ++l) {
      auto& L = layout.kv[l];
      const auto t = rd.get<std::int32_t>("k type");
      const auto row = rd.get<std::uint64_t>("k row");
      if (learn) L.k_type = t, L.k_row = row;
      detail::expect(t == L.k_type && row == L.k_row, "a K row's type or size changed");
      out.k[l] = rd.take(row * n, "k rows");
    }
    for (std::uint32_t l = 0; l < n_layer; ++l) {
      auto& L = layout.kv[l];
      const auto t = rd.get<std::int32_t>("v type");
      if (!layout.v_trans) {
        const auto row = rd.get<std::uint64_t>("v row");
        if (learn) L.v_type = t, L.v_row = row;
        detail::expect(t == L.v_type && row == L.v_row, "a V row's type or size changed");
        out.v[l] = rd.take(row * n, "v rows");
      } else {
        const auto el = rd.get<std::uint32_t>("v el");
        const auto vn = rd.get<std::uint32_t>("v n_embd");
        if (learn) L.v_type = t, L.v_el = el, L.v_n = vn, L.v_row = std::uint64_t{el} * vn;
        detail::expect(t == L.v_type && el == L.v_el && vn == L.v_n, "a transposed V's type or size changed");
        out.v[l] = rd.take(std::uint64_t{el} * vn * n, "v elements");
      }
    }
  }
  detail::expect(found || !learn, "the probe state holds no cell");
  read_recurrent(rd, layout, learn, out);
  detail::expect(rd.done(), "bytes left after the recurrent part");
}

/// Learns a context's layout from a probe: the whole state of a sequence of `tokens` that were
/// just prefilled (positions 0..n-1). Whether cells carry the extra is found by reading it
/// both ways: exactly one must parse with the probe's positions and tokens.
inline state_layout learn_layout(std::span<const std::byte> probe, std::span<const std::int32_t> tokens) {
  std::string why;
  for (const bool ext : {false, true}) {
    state_layout l;
    l.cell_ext = ext;
    full_state_view v;
    try {
      read_full_state(probe, l, /*learn=*/true, v);
    } catch (const hybridcache::invalid_argument& e) {
      why += std::string(ext ? " with" : " without") + " the cell extra: " + e.what() + ";";
      continue;
    }
    bool ok = v.pos.size() == tokens.size() && !l.kv.empty() && !l.rec.empty();
    for (std::size_t i = 0; ok && i < v.pos.size(); ++i) ok = v.pos[i] == static_cast<std::int32_t>(i);
    for (std::size_t i = 0; ok && ext && i < v.token.size(); ++i) ok = v.token[i] == tokens[i];
    if (ok) return l;
    why += std::string(ext ? " with" : " without") + " the cell extra: cells do not match the probe;";
  }
  throw hybridcache::invalid_argument("llama state: cannot learn the layout from the probe (not a hybrid model with "
                                      "attention and recurrent layers?):" + why);
}

/// The recurrent part of a PARTIAL_ONLY state (a snapshot), checked against `layout`.
inline void read_snapshot(std::span<const std::byte> buf, state_layout& layout, full_state_view& out) {
  detail::reader rd(buf);
  detail::expect(rd.get<std::uint32_t>("magic") == state_magic, "bad magic (not a sequence state of this llama.cpp)");
  (void)rd.get<std::int32_t>("seq id");
  read_recurrent(rd, layout, /*learn=*/false, out);
  detail::expect(rd.done(), "bytes left after the snapshot");
  detail::expect(out.rec_pos >= 0, "the snapshot holds no recurrent state");
}

/// Writes the whole state of a sequence holding tokens [0, n) in position order into `out`
/// (cleared first): `kv_row(p, l, k, v)` copies token p's K row of layer l into `k` and its V
/// row into `v` (v_row bytes, element-major order as a plain row); `rec_row(i, r, s)` copies
/// recurrent layer i's conv and SSM rows. `rec_pos` is the recurrent state's last position
/// (n - 1). O(n * kv_token_bytes + rec_bytes).
template <class KvRow, class RecRow>
void write_full_state(const state_layout& layout, std::uint32_t stream, std::span<const std::int32_t> tokens, KvRow&& kv_row,
                      RecRow&& rec_row, std::vector<std::byte>& out) {
  out.clear();
  const auto n = static_cast<std::uint32_t>(tokens.size());
  detail::writer w(out);
  w.put<std::uint32_t>(state_magic);
  w.put<std::int32_t>(0);
  w.put<std::uint32_t>(layout.streams);
  for (std::uint32_t st = 0; st < layout.streams; ++st) {
    if (st != stream || n == 0) {
      w.put<std::uint32_t>(0);
      continue;
    }
    w.put<std::uint32_t>(n);
    for (std::uint32_t c = 0; c < n; ++c) {
      w.put<std::int32_t>(static_cast<std::int32_t>(c));
      w.put<std::uint32_t>(1);
      if (layout.cell_ext) {
        w.put<std::int32_t>(static_cast<std::int32_t>(c));
        w.put<std::int32_t>(static_cast<std::int32_t>(c));
        w.put<std::int32_t>(tokens[c]);
      }
      w.put<std::int32_t>(0);
    }
    w.put<std::uint32_t>(layout.v_trans ? 1 : 0);
    w.put<std::uint32_t>(static_cast<std::uint32_t>(layout.kv.size()));
    // Headers first, remembering where each layer's rows go; rows once `out` stops growing.
    std::vector<std::size_t> koff(layout.kv.size()), voff(layout.kv.size());
    for (std::size_t l = 0; l < layout.kv.size(); ++l) {
      w.put<std::int32_t>(layout.kv[l].k_type);
      w.put<std::uint64_t>(layout.kv[l].k_row);
      koff[l] = out.size();
      (void)w.grow(layout.kv[l].k_row * n);
    }
    for (std::size_t l = 0; l < layout.kv.size(); ++l) {
      const auto& L = layout.kv[l];
      w.put<std::int32_t>(L.v_type);
      if (!layout.v_trans) {
        w.put<std::uint64_t>(L.v_row);
      } else {
        w.put<std::uint32_t>(L.v_el);
        w.put<std::uint32_t>(L.v_n);
      }
      voff[l] = out.size();
      (void)w.grow(L.v_row * n);
    }
    std::vector<std::byte> vrow;
    for (std::size_t l = 0; l < layout.kv.size(); ++l) {
      const auto& L = layout.kv[l];
      std::byte* kbase = out.data() + koff[l];
      std::byte* vbase = out.data() + voff[l];
      vrow.resize(L.v_row);
      for (std::uint32_t c = 0; c < n; ++c) {
        if (!layout.v_trans) {
          kv_row(static_cast<std::int64_t>(c), l, kbase + std::uint64_t{c} * L.k_row, vbase + std::uint64_t{c} * L.v_row);
          continue;
        }
        kv_row(static_cast<std::int64_t>(c), l, kbase + std::uint64_t{c} * L.k_row, vrow.data());
        for (std::uint32_t j = 0; j < L.v_n; ++j)
          std::memcpy(vbase + (std::uint64_t{j} * n + c) * L.v_el, vrow.data() + std::uint64_t{j} * L.v_el, L.v_el);
      }
    }
  }
  // The recurrent part: one cell at n - 1, no sequence ids.
  w.put<std::uint32_t>(1);
  w.put<std::int32_t>(static_cast<std::int32_t>(n) - 1);
  w.put<std::uint32_t>(0);
  w.put<std::uint32_t>(0);
  w.put<std::uint32_t>(layout.model_layers);
  std::vector<std::size_t> roff(layout.rec.size()), soff(layout.rec.size());
  for (std::size_t i = 0; i < layout.rec.size(); ++i) {
    w.put<std::int32_t>(layout.rec[i].r_type);
    w.put<std::uint64_t>(layout.rec[i].r_row);
    roff[i] = out.size();
    (void)w.grow(layout.rec[i].r_row);
  }
  for (std::size_t i = 0; i < layout.rec.size(); ++i) {
    w.put<std::int32_t>(layout.rec[i].s_type);
    w.put<std::uint64_t>(layout.rec[i].s_row);
    soff[i] = out.size();
    (void)w.grow(layout.rec[i].s_row);
  }
  for (std::size_t i = 0; i < layout.rec.size(); ++i) rec_row(i, out.data() + roff[i], out.data() + soff[i]);
}

/// Copies cell c's V row of layer l out of a full state (gathering a transposed V).
inline void copy_v_row(const state_layout& layout, const full_state_view& v, std::size_t l, std::size_t c, std::byte* dst) {
  const auto& L = layout.kv[l];
  if (!layout.v_trans) {
    std::memcpy(dst, v.v[l] + c * L.v_row, L.v_row);
    return;
  }
  const std::size_t cells = v.pos.size();
  for (std::uint32_t j = 0; j < L.v_n; ++j) std::memcpy(dst + std::uint64_t{j} * L.v_el, v.v[l] + (j * cells + c) * L.v_el, L.v_el);
}

}  // namespace hybridcache_llama
