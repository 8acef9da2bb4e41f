/*
 * chat_impl.h - private to tokenizer/: the render object that chat.c's
 * built-in templates and chat_template.c's Jinja templates both build, and
 * the helpers that build it.
 */
#ifndef EN_CHAT_IMPL_H
#define EN_CHAT_IMPL_H

#include "chat.h"

struct en_chat_render {
    char *text; /* all segment text back to back, NUL-terminated */
    size_t len, cap;
    en_chat_segment *segs; /* while building, segs[i].text holds the offset */
    int n_segs, cap_segs;
    int failed;  /* an allocation failed while building */
    int textual; /* special tokens are in the text (a Jinja template): encode
                    the whole text at once, as transformers does */
};

/* A new empty render (NULL on OOM). */
en_chat_render *en_chat_render_new(void);

/* Append n bytes of text with the given flags. Text joins the previous
 * segment when nothing (a bos/eos id or a change of train flag) separates
 * them. Errors are sticky in r->failed so that templates read straight. */
void en_chat_emit(en_chat_render *r, const char *s, size_t n, int train, int bos_before,
                  int eos_after);

/* Turn segment offsets into pointers and hand r to *out; on a sticky
 * failure destroy r and return EN_ERR_NOMEM. */
en_status en_chat_render_finish(en_chat_render *r, en_chat_render **out, en_err *err);

#endif /* EN_CHAT_IMPL_H */
