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
