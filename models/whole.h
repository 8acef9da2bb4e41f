/*
 * whole.h - a training run's tensors as whole tensors, whatever the
 * tensor-parallel layout and whichever backend holds them: what
 * layout-free checkpoints, resume and the final model or adapter are made
 * of. The trainable vector of this rank (its parameters, a moment: backend
 * memory, en_train_tensor's layout) is gathered into whole host tensors
 * for writing, and whole tensors read back are sliced for this rank by the
 * loader's slicer (en_tp_slice) and uploaded. A training loop calls these
 * and never a collective or a backend function.
 */
#ifndef EN_WHOLE_H
#define EN_WHOLE_H

#include "../common/safetensors.h"
#include "../common/status.h"
#include "lora.h"
#include "model.h"
#include "train.h"

typedef struct en_whole en_whole;

/* The whole view of t's trainable tensors: the model's weights, or the
 * adapter `lora` (t trains it; NULL for full fine-tuning). t, model and
 * lora are borrowed. EN_ERR_NOMEM. */
en_status en_whole_create(en_train *t, en_model *model, en_lora *lora, en_whole **out,
                          en_err *err);
void en_whole_destroy(en_whole *w); /* NULL is a no-op */

/* Gather `local` (backend memory: the trainable layout of this rank) into
 * whole host vector number `slot` (0, 1 or 2: three may be held at once,
 * e.g. the parameters and both moments) and point *whole at it. Collective
 * over the tensor-parallel group. With one rank on a backend whose buffers
 * are host memory, *whole is local itself (no copy). */
en_status en_whole_gather(en_whole *w, int slot, const float *local, const float **whole,
                          en_err *err);

/* Safetensors items (flat float32) named prefix + each tensor's name over
 * a whole vector; names holds 160 bytes per tensor. en_free the result.
 * NULL when out of memory. n_items: the count. */
en_st_writer_item *en_whole_items(const en_whole *w, const float *whole, const char *prefix,
                                  char (*names)[160], int *n_items);

/* The model's weights as its family stores them (fused and transposed
 * where the checkpoint format has them so), from the whole parameter
 * vector: items for a safetensors writer (en_free *items and *scratch).
 * Full fine-tuning only. Returns the count, -1 when out of memory. */
int en_whole_model_items(const en_whole *w, const float *whole, en_st_writer_item **items,
                         float **scratch);

/* The whole adapter holding the whole parameter vector (for
 * en_lora_save_peft). LoRA runs only. */
const en_lora *en_whole_adapter(en_whole *w, const float *whole);

/* Resume: the tensors prefix + name of the safetensors file at path, whole,
 * sliced for this rank into host_local (the trainable count of floats,
 * host memory). EN_ERR_FORMAT naming the file and tensor when one is
 * missing or has the wrong size. */
en_status en_whole_read(const en_whole *w, const char *path, const char *prefix,
                        float *host_local, en_err *err);

/* Resume an adapter: its tensors (PEFT names, no prefix) from path into
 * the trainer's parameters. */
en_status en_whole_load_params(en_whole *w, const char *path, en_err *err);

#endif /* EN_WHOLE_H */
