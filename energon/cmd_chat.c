/* cmd_chat.c - placeholder until the command lands (issue 5). */
#include <stdio.h>

#include "cli.h"

int en_cmd_chat(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "energon chat: not built yet\n");
    return EN_EXIT_ERROR;
}
