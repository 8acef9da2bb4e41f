/* placeholder so the finetune library is never empty; removed once real sources land. */
typedef int en_finetune_placeholder_t;
