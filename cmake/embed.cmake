# Turn a file into a C array: cmake -DIN=file -DOUT=file.c -DSYMBOL=name -P embed.cmake
# defines `const unsigned char NAME[]` (NUL-terminated) and `const unsigned long NAME_len`.
file(READ ${IN} _hex HEX)
string(LENGTH "${_hex}" _n)
math(EXPR _bytes "${_n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," _arr "${_hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" _arr "${_arr}")
file(WRITE ${OUT} "/* generated from ${IN} by cmake/embed.cmake; do not edit */\n"
     "const unsigned char ${SYMBOL}[] = {\n${_arr}0x00};\n"
     "const unsigned long ${SYMBOL}_len = ${_bytes};\n")
