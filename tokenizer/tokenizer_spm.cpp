/*
 * tokenizer_spm.cpp - the SentencePiece half of tokenizer.h: the private
 * en_spm object (tokenizer_impl.h) that tokenizer.c dispatches to for a
 * `tokenizer.model` (loading, encode/decode, special ids and piece lookups),
 * and the trainer (en_tokenizer_train).
 *
 * This is the only C++ file in energon. Every entry point is extern "C" and
 * catches every exception, so no C++ type or exception reaches C callers;
 * memory handed to callers comes from en_malloc. What it leaves out: sampling
 * encoders (n-best, subword regularisation) and the streaming decoder, which
 * lives in detok.c on top of en_tokenizer_decode.
 *
 * SentencePiece's CHECK/LOG(FATAL) paths inside the library still abort; we
 * avoid them by validating input here (UTF-8, id ranges, config values)
 * before calling in.
 */
#include "tokenizer.h"
#include "tokenizer_impl.h"

#include "../common/utf8.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <unistd.h>

struct en_spm {
    sentencepiece::SentencePieceProcessor sp;
    /* Cached at load time: the getters are then plain reads, which keeps them
     * thread-safe and cheap. */
    int32_t n_vocab;
    int32_t bos, eos, unk, pad;
};

namespace {

/* Run `fn`, turning any C++ exception into an en_status with a message. */
template <typename Fn> en_status guarded(en_err *err, const char *what, Fn &&fn) {
    try {
        return fn();
    } catch (const std::bad_alloc &) {
        return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", what);
    } catch (const std::exception &e) {
        return EN_ERR(err, EN_ERR_FORMAT, "%s: sentencepiece raised: %s", what, e.what());
    } catch (...) {
        return EN_ERR(err, EN_ERR_FORMAT, "%s: sentencepiece raised an unknown exception", what);
    }
}

/* Map a SentencePiece status to ours. File-system failures are EN_ERR_IO;
 * bad arguments stay EN_ERR_ARG; everything else (unparsable or inconsistent
 * data) is EN_ERR_FORMAT. */
en_status status_from_spm(const sentencepiece::util::Status &s) {
    using sentencepiece::util::StatusCode;
    switch (s.code()) {
    case StatusCode::kOk: return EN_OK;
    case StatusCode::kNotFound:
    case StatusCode::kPermissionDenied: return EN_ERR_IO;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange: return EN_ERR_ARG;
    case StatusCode::kResourceExhausted: return EN_ERR_NOMEM;
    default: return EN_ERR_FORMAT;
    }
}

/* The text of a SentencePiece error without the "file.cc(123) [expr] "
 * prefix its CHECK macros add, which means nothing to our users. */
std::string spm_message(const sentencepiece::util::Status &s) {
    std::string m = s.message();
    size_t at = m.find(".cc(");
    size_t open = at == std::string::npos ? at : m.find(") [", at);
    size_t close = open == std::string::npos ? open : m.find("] ", open);
    if (close != std::string::npos && close + 2 < m.size()) m = m.substr(close + 2);
    while (!m.empty() && (m.back() == ' ' || m.back() == '\n'))
        m.pop_back();
    return m.empty() ? s.ToString() : m;
}

/* ---- a model's normalization rules ----
 * SentencePiece walks a normalizer's precompiled_charsmap (a Darts-clone
 * double array, then the replacement strings) without bounds checks: a
 * corrupt one reads outside the model while encoding or decoding (found by
 * tests/fuzz/fuzz_spm.c). Before a model is used, every node a lookup can
 * reach is checked here, in the model as SentencePiece re-serializes it
 * (each field once). */

bool pb_varint(const unsigned char *&p, const unsigned char *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
        unsigned char b = *p++;
        *v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return true;
    }
    return false;
}

/* The bytes of length-delimited field `want` of a protobuf message (the
 * last one; empty when absent). false when msg is not wire format. */
bool pb_field(std::string_view msg, uint64_t want, std::string_view *out) {
    const unsigned char *p = (const unsigned char *)msg.data(), *end = p + msg.size();
    *out = std::string_view();
    while (p < end) {
        uint64_t key, v;
        if (!pb_varint(p, end, &key)) return false;
        switch (key & 7) {
        case 0:
            if (!pb_varint(p, end, &v)) return false;
            break;
        case 1:
        case 5: {
            size_t n = (key & 7) == 1 ? 8 : 4;
            if ((size_t)(end - p) < n) return false;
            p += n;
            break;
        }
        case 2:
            if (!pb_varint(p, end, &v) || v > (uint64_t)(end - p)) return false;
            if ((key >> 3) == want) *out = std::string_view((const char *)p, (size_t)v);
            p += v;
            break;
        default: return false; /* groups: never in a SentencePiece model */
        }
    }
    return true;
}

/* What Darts-clone's commonPrefixSearch reads of a unit (darts.h). */
uint32_t darts_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

/* NULL when a precompiled_charsmap is empty or safe for SentencePiece's
 * lookups: a uint32 trie size, the trie, the NUL-separated strings. */
const char *charsmap_problem(std::string_view blob) {
    if (blob.empty()) return nullptr;
    uint32_t size = 0;
    if (blob.size() <= sizeof size) return "shorter than its header";
    memcpy(&size, blob.data(), sizeof size); /* little-endian, as SentencePiece reads it */
    if (size > blob.size() - sizeof size) return "its trie is larger than the rules";
    const size_t n = size / 4, n_text = blob.size() - sizeof size - size;
    if (n == 0) return "its trie is empty";
    std::vector<uint32_t> unit(n);
    memcpy(unit.data(), blob.data() + sizeof size, n * 4);
    /* From node p a byte c leads to q = (p ^ offset(p)) ^ c, which is read
     * before its label is compared: the whole block of 256 must lie in the
     * trie. A node q reached (label c) with a leaf has its value at
     * q ^ offset(q): an index into the strings. */
    std::vector<uint8_t> seen(n);
    std::vector<uint32_t> todo{0};
    seen[0] = 1;
    while (!todo.empty()) {
        uint32_t p = todo.back();
        todo.pop_back();
        uint32_t base = p ^ darts_offset(unit[p]);
        if ((base | 0xFFu) >= n) return "a trie node points outside the trie";
        for (uint32_t c = 0; c < 256; c++) {
            uint32_t q = base ^ c, u = unit[q];
            if ((u & ((1u << 31) | 0xFFu)) != c) continue;
            uint32_t leaf = q ^ darts_offset(u);
            if ((leaf | 0xFFu) >= n) return "a trie node points outside the trie";
            if (((u >> 8) & 1) && (unit[leaf] & 0x7FFFFFFFu) >= n_text)
                return "a rule points outside its strings";
            if (!seen[q]) {
                seen[q] = 1;
                todo.push_back(q);
            }
        }
    }
    return nullptr;
}

/* "" when the loaded model's normalizer and denormalizer are safe to use,
 * else what is wrong. */
std::string normalizer_problem(const sentencepiece::SentencePieceProcessor &sp) {
    const std::string proto = sp.serialized_model_proto();
    static const struct {
        uint64_t field;
        const char *name;
    } specs[] = {{3, "normalizer_spec"}, {5, "denormalizer_spec"}};
    for (const auto &s : specs) {
        std::string_view spec, charsmap;
        if (!pb_field(proto, s.field, &spec) || !pb_field(spec, 2, &charsmap))
            return std::string("cannot read its ") + s.name;
        if (const char *why = charsmap_problem(charsmap))
            return std::string(s.name) + ".precompiled_charsmap is corrupt: " + why;
    }
    return "";
}

/* Read a whole file; on failure fills err with the path and errno text. */
en_status read_file(const char *path, std::string *out, en_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return EN_ERR(err, EN_ERR_IO, "cannot open tokenizer model '%s': %s", path,
                      strerror(errno));
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        out->append(buf, n);
    int bad = ferror(f);
    int saved = errno;
    fclose(f);
    if (bad)
        return EN_ERR(err, EN_ERR_IO, "cannot read tokenizer model '%s': %s", path,
                      strerror(saved));
    return EN_OK;
}

/* Feeds the trainer one line at a time from a list of files, so file names
 * may contain commas (SentencePiece's --input is comma separated) and a
 * missing file is reported with its name. */
class FileLines : public sentencepiece::SentenceIterator {
  public:
    FileLines(const char *const *paths, int n) : paths_(paths), n_(n) { Next(); }
    ~FileLines() override {
        if (f_) fclose(f_);
        free(buf_);
    }
    bool done() const override { return done_; }
    const std::string &value() const override { return line_; }
    sentencepiece::util::Status status() const override { return status_; }
    void Next() override {
        for (;;) {
            if (!f_) {
                if (idx_ >= n_) {
                    done_ = true;
                    return;
                }
                f_ = fopen(paths_[idx_], "rb");
                if (!f_) {
                    status_ =
                        sentencepiece::util::Status(sentencepiece::util::StatusCode::kNotFound,
                                                    std::string("cannot open training input '") +
                                                        paths_[idx_] + "': " + strerror(errno));
                    done_ = true;
                    return;
                }
            }
            if (read_line()) return;
            bool bad = ferror(f_) != 0;
            fclose(f_);
            f_ = nullptr;
            if (bad) {
                status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kInternal,
                                                      std::string("cannot read training input '") +
                                                          paths_[idx_] + "'");
                done_ = true;
                return;
            }
            idx_++;
        }
    }

  private:
    /* One line without its "\n" (or "\r\n"); false at end of file. */
    bool read_line() {
        ssize_t n = getline(&buf_, &cap_, f_);
        if (n < 0) return false;
        if (n > 0 && buf_[n - 1] == '\n') n--;
        if (n > 0 && buf_[n - 1] == '\r') n--;
        line_.assign(buf_, (size_t)n);
        return true;
    }

    const char *const *paths_;
    int n_;
    int idx_ = 0;
    FILE *f_ = nullptr;
    char *buf_ = nullptr; /* getline's buffer (malloc'd by libc) */
    size_t cap_ = 0;
    std::string line_;
    bool done_ = false;
    sentencepiece::util::Status status_;
};

} // namespace

extern "C" {

en_status en_spm_create(const char *model_path, en_spm **out, en_err *err) {
    *out = nullptr;
    return guarded(err, model_path, [&]() -> en_status {
        std::string bytes;
        EN_TRY(read_file(model_path, &bytes, err));
        if (bytes.empty())
            return EN_ERR(err, EN_ERR_FORMAT, "tokenizer model '%s' is empty", model_path);

        void *mem = en_malloc(sizeof(en_spm));
        if (!mem) return EN_ERR(err, EN_ERR_NOMEM, "loading '%s': out of memory", model_path);
        en_spm *tok;
        try {
            tok = new (mem) en_spm();
        } catch (...) {
            en_free(mem);
            throw;
        }
        en_status st = EN_OK;
        try {
            auto s = tok->sp.LoadFromSerializedProto(bytes);
            if (!s.ok()) {
                /* The parse failure's own text is a source location only. */
                std::string why = spm_message(s);
                if (why.find("ParseFromArray") != std::string::npos)
                    why = "not a serialized ModelProto (protobuf parse failed)";
                st = EN_ERR(err, EN_ERR_FORMAT, "'%s' is not a valid SentencePiece model: %s",
                            model_path, why.c_str());
            } else if (std::string why = normalizer_problem(tok->sp); !why.empty()) {
                st = EN_ERR(err, EN_ERR_FORMAT, "'%s' is not a valid SentencePiece model: %s",
                            model_path, why.c_str());
            } else if (tok->sp.GetPieceSize() <= 0) {
                st = EN_ERR(err, EN_ERR_FORMAT, "'%s' is a SentencePiece model with no pieces",
                            model_path);
            } else {
                tok->n_vocab = tok->sp.GetPieceSize();
                tok->bos = tok->sp.bos_id();
                tok->eos = tok->sp.eos_id();
                tok->unk = tok->sp.unk_id();
                tok->pad = tok->sp.pad_id();
            }
        } catch (...) {
            en_spm_destroy(tok);
            throw;
        }
        if (st != EN_OK) {
            en_spm_destroy(tok);
            return st;
        }
        *out = tok;
        return EN_OK;
    });
}

void en_spm_destroy(en_spm *tok) {
    if (!tok) return;
    tok->~en_spm();
    en_free_impl(tok);
}

int32_t en_spm_n_vocab(const en_spm *tok) { return tok->n_vocab; }
int32_t en_spm_bos(const en_spm *tok) { return tok->bos; }
int32_t en_spm_eos(const en_spm *tok) { return tok->eos; }
int32_t en_spm_unk(const en_spm *tok) { return tok->unk; }
int32_t en_spm_pad(const en_spm *tok) { return tok->pad; }

const char *en_spm_piece(const en_spm *tok, int32_t id) {
    if (id < 0 || id >= tok->n_vocab) return nullptr;
    /* IdToPiece returns a reference into the loaded model: stable while tok
     * lives, and it does not throw for in-range ids. */
    return tok->sp.IdToPiece(id).c_str();
}

int32_t en_spm_piece_id(const en_spm *tok, const char *piece) {
    if (!piece) return -1;
    try {
        /* PieceToId answers unk_id for unknown strings: check the round trip. */
        int id = tok->sp.PieceToId(piece);
        if (id < 0 || id >= tok->n_vocab) return -1;
        if (tok->sp.IdToPiece(id) != piece) return -1;
        return id;
    } catch (...) {
        return -1;
    }
}

en_status en_spm_encode(const en_spm *tok, const char *text, size_t len, int32_t **ids,
                        size_t **offsets, size_t *n_ids, en_err *err) {
    *ids = nullptr;
    if (offsets) *offsets = nullptr;
    *n_ids = 0;
    return guarded(err, "encode", [&]() -> en_status {
        /* The immutable proto carries each piece's byte span in the input. */
        sentencepiece::ImmutableSentencePieceText spt;
        auto s = tok->sp.Encode(std::string_view(len ? text : "", len), spt.mutable_proto());
        if (!s.ok())
            return EN_ERR(err, status_from_spm(s), "encode: sentencepiece: %s",
                          spm_message(s).c_str());
        size_t n = spt.pieces_size();
        int32_t *buf = (int32_t *)en_malloc((n ? n : 1) * sizeof(int32_t));
        size_t *off = offsets ? (size_t *)en_malloc((n ? n : 1) * sizeof(size_t)) : nullptr;
        if (!buf || (offsets && !off)) {
            en_free(buf);
            en_free(off);
            return EN_ERR(err, EN_ERR_NOMEM, "encode: out of memory for %zu ids", n);
        }
        for (size_t i = 0; i < n; i++) {
            auto p = spt.pieces((int)i);
            buf[i] = (int32_t)p.id();
            if (off) off[i] = p.begin() <= len ? p.begin() : len;
        }
        *ids = buf;
        if (offsets) *offsets = off;
        *n_ids = n;
        return EN_OK;
    });
}

en_status en_spm_decode(const en_spm *tok, const int32_t *ids, size_t n_ids, char **text,
                        size_t *len, en_err *err) {
    *text = nullptr;
    if (len) *len = 0;
    return guarded(err, "decode", [&]() -> en_status {
        std::vector<int> v(ids, ids + n_ids);
        std::string out;
        auto s = tok->sp.Decode(v, &out);
        if (!s.ok())
            return EN_ERR(err, status_from_spm(s), "decode: sentencepiece: %s",
                          spm_message(s).c_str());
        /* bound: the decoded string and its NUL */
        char *buf = (char *)en_malloc(out.size() + 1);
        if (!buf)
            return EN_ERR(err, EN_ERR_NOMEM, "decode: out of memory for %zu bytes", out.size());
        memcpy(buf, out.data(), out.size());
        buf[out.size()] = '\0';
        *text = buf;
        if (len) *len = out.size();
        return EN_OK;
    });
}

en_tokenizer_train_config en_tokenizer_train_config_default(void) {
    en_tokenizer_train_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 8000;
    c.model_type = "bpe";
    c.byte_fallback = 1;
    return c;
}

/* Trains with Llama-style settings so that decode(encode(text)) == text for
 * any UTF-8: the identity normaliser, whitespace kept as is, digits split,
 * whitespace-only pieces allowed, and (by default) byte fallback. The model
 * is serialised in memory and written to exactly cfg->out_path (the
 * SentencePiece trainer would otherwise write PREFIX.model and PREFIX.vocab).
 * SentencePiece's progress log is turned down to warnings (a process-wide
 * setting of the library). Lines over 4192 bytes are skipped by the trainer
 * (its max_sentence_length). Not thread-safe: the trainer has global state. */
en_status en_tokenizer_train(const en_tokenizer_train_config *cfg, en_err *err) {
    if (!cfg) return EN_ERR(err, EN_ERR_ARG, "train: config is NULL");
    if (!cfg->inputs || cfg->n_inputs <= 0)
        return EN_ERR(err, EN_ERR_ARG, "train: no input files (inputs/n_inputs)");
    for (int i = 0; i < cfg->n_inputs; i++)
        if (!cfg->inputs[i] || !*cfg->inputs[i])
            return EN_ERR(err, EN_ERR_ARG, "train: input file %d has an empty path", i);
    if (!cfg->out_path || !*cfg->out_path)
        return EN_ERR(err, EN_ERR_ARG, "train: out_path is empty");
    if (cfg->vocab_size <= 0)
        return EN_ERR(err, EN_ERR_ARG, "train: vocab_size must be positive (got %d)",
                      cfg->vocab_size);
    const char *type = cfg->model_type ? cfg->model_type : "bpe";
    if (strcmp(type, "bpe") != 0 && strcmp(type, "unigram") != 0)
        return EN_ERR(err, EN_ERR_ARG,
                      "train: model_type must be \"bpe\" or \"unigram\" (got \"%s\")", type);
    if (cfg->character_coverage < 0 || cfg->character_coverage > 1)
        return EN_ERR(err, EN_ERR_ARG, "train: character_coverage must be in (0, 1] (got %g)",
                      cfg->character_coverage);
    if (cfg->n_threads < 0)
        return EN_ERR(err, EN_ERR_ARG, "train: n_threads must be >= 0 (got %d)", cfg->n_threads);
    /* Fail before a possibly long training run if the inputs are unreadable. */
    for (int i = 0; i < cfg->n_inputs; i++) {
        FILE *f = fopen(cfg->inputs[i], "rb");
        if (!f)
            return EN_ERR(err, EN_ERR_IO, "train: cannot open input '%s': %s", cfg->inputs[i],
                          strerror(errno));
        fclose(f);
    }
    /* ... or if the output cannot be written (checked again when writing). */
    {
        std::string dir = cfg->out_path;
        size_t slash = dir.find_last_of('/');
        dir = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
        if (access(dir.c_str(), W_OK | X_OK) != 0)
            return EN_ERR(err, EN_ERR_IO, "train: cannot write '%s': %s", cfg->out_path,
                          strerror(errno));
    }

    return guarded(err, "train", [&]() -> en_status {
        std::unordered_map<std::string, std::string> kw = {
            /* No model_prefix: with an in-memory output the trainer wants none. */
            {"model_type", type},
            {"vocab_size", std::to_string(cfg->vocab_size)},
            {"byte_fallback", cfg->byte_fallback ? "true" : "false"},
            {"normalization_rule_name", "identity"},
            {"remove_extra_whitespaces", "false"},
            {"split_digits", "true"},
            {"allow_whitespace_only_pieces", "true"},
            {"minloglevel", "1"},
        };
        if (cfg->character_coverage > 0) {
            char buf[32];
            snprintf(buf, sizeof buf, "%.17g", cfg->character_coverage);
            kw["character_coverage"] = buf;
        }
        if (cfg->n_threads > 0) kw["num_threads"] = std::to_string(cfg->n_threads);

        FileLines lines(cfg->inputs, cfg->n_inputs);
        std::string model;
        auto s = sentencepiece::SentencePieceTrainer::Train(kw, &lines, &model);
        if (!lines.status().ok())
            return EN_ERR(err, EN_ERR_IO, "train: %s", lines.status().message());
        if (!s.ok()) {
            en_status st = status_from_spm(s);
            /* Training failures come from the data or the settings (e.g. a
             * vocab_size too small for the characters seen). */
            if (st == EN_ERR_FORMAT) st = EN_ERR_ARG;
            return EN_ERR(err, st, "training failed: %s", spm_message(s).c_str());
        }
        if (model.empty())
            return EN_ERR(err, EN_ERR_FORMAT, "train: sentencepiece returned an empty model");

        FILE *f = fopen(cfg->out_path, "wb");
        if (!f)
            return EN_ERR(err, EN_ERR_IO, "train: cannot create '%s': %s", cfg->out_path,
                          strerror(errno));
        size_t w = fwrite(model.data(), 1, model.size(), f);
        int saved = errno;
        if (fclose(f) != 0 && w == model.size()) {
            saved = errno;
            w = 0;
        }
        if (w != model.size()) {
            remove(cfg->out_path);
            return EN_ERR(err, EN_ERR_IO, "train: cannot write '%s': %s", cfg->out_path,
                          strerror(saved));
        }
        return EN_OK;
    });
}

} /* extern "C" */
