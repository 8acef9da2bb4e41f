/* chat.c - chat templates (being written). */
typedef int en_chat_placeholder_t;
