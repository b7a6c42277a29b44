/* probing-inject: dlopen in the target's libc and the helper's entry point, from /proc/PID/maps and
 * the files' dynamic symbol tables (no debug symbols needed). */
#include "inject.h"

/* --- ELF: a symbol of a shared library file ------------------------------------------- */

/* A defined dynamic symbol's value (st_value), and the file's lowest load address. */
static int elf_symbol(const char *path, const char *name, uint64_t *value, uint64_t *lowest_out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat info;
    if (fstat(fd, &info) != 0 || info.st_size < (off_t)sizeof(Elf64_Ehdr)) {
        close(fd);
        return 0;
    }
    size_t size = (size_t)info.st_size;
    unsigned char *file = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (file == MAP_FAILED) return 0;
    int found = 0;
    Elf64_Ehdr *header = (Elf64_Ehdr *)file;
    if (memcmp(header->e_ident, ELFMAG, SELFMAG) != 0 || header->e_ident[EI_CLASS] != ELFCLASS64 ||
        header->e_shoff + (uint64_t)header->e_shnum * sizeof(Elf64_Shdr) > size)
        goto done;
    Elf64_Shdr *sections = (Elf64_Shdr *)(file + header->e_shoff);
    /* Load bias of the file: the lowest PT_LOAD address (0 for every shared library we meet). */
    uint64_t lowest = UINT64_MAX;
    if (header->e_phoff + (uint64_t)header->e_phnum * sizeof(Elf64_Phdr) <= size) {
        Elf64_Phdr *segments = (Elf64_Phdr *)(file + header->e_phoff);
        for (int i = 0; i < header->e_phnum; i++)
            if (segments[i].p_type == PT_LOAD && segments[i].p_vaddr < lowest)
                lowest = segments[i].p_vaddr & ~(uint64_t)0xfff;
    }
    if (lowest == UINT64_MAX) lowest = 0;
    for (int i = 0; i < header->e_shnum && !found; i++) {
        if (sections[i].sh_type != SHT_DYNSYM || sections[i].sh_link >= header->e_shnum) continue;
        Elf64_Shdr *strings = &sections[sections[i].sh_link];
        if (sections[i].sh_offset + sections[i].sh_size > size || strings->sh_offset + strings->sh_size > size)
            continue;
        Elf64_Sym *symbols = (Elf64_Sym *)(file + sections[i].sh_offset);
        size_t count = sections[i].sh_size / sizeof(Elf64_Sym);
        for (size_t j = 0; j < count; j++) {
            if (symbols[j].st_name >= strings->sh_size || symbols[j].st_shndx == SHN_UNDEF) continue;
            if (strcmp((char *)file + strings->sh_offset + symbols[j].st_name, name) == 0) {
                *value = symbols[j].st_value;
                if (lowest_out) *lowest_out = lowest;
                found = 1;
                break;
            }
        }
    }
done:
    munmap(file, size);
    return found;
}

/* --- /proc/PID/maps ---------------------------------------------------------------------- */



static int is_libc(const char *path) {
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    return strncmp(name, "libc.so", 7) == 0 || strncmp(name, "libc-", 5) == 0 ||
           strncmp(name, "ld-musl-", 8) == 0;
}

static int read_maps(struct target *target) {
    char path[64], exe[PATH_MAX];
    snprintf(path, sizeof path, "/proc/%d/exe", target->pid);
    ssize_t length = readlink(path, exe, sizeof exe - 1);
    exe[length > 0 ? length : 0] = '\0';
    snprintf(path, sizeof path, "/proc/%d/maps", target->pid);
    FILE *maps = fopen(path, "re");
    if (!maps) return 0;
    char line[PATH_MAX + 256];
    while (fgets(line, sizeof line, maps)) {
        uint64_t start, end, offset, inode;
        unsigned major_number, minor_number;
        char permissions[8], file[PATH_MAX] = "";
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %4095[^\n]", &start, &end, permissions, &offset, &major_number,
                   &minor_number, &inode, file) < 7)
            continue;
        if (file[0] == '\0') continue;
        if (!target->libc_base && offset == 0 && is_libc(file)) {
            snprintf(target->libc, sizeof target->libc, "%s", file);
            target->libc_base = start;
            target->libc_end = end;
            target->libc_major = major_number;
            target->libc_minor = minor_number;
            target->libc_inode = inode;
        }
        const char *base = strrchr(file, '/');
        base = base ? base + 1 : file;
        if (permissions[2] == 'x' && target->loader_ranges < MAX_RANGES && strncmp(base, "ld-", 3) == 0) {
            target->loader_text[target->loader_ranges][0] = start;
            target->loader_text[target->loader_ranges][1] = end;
            target->loader_ranges++;
        }
        if (permissions[2] == 'x' && target->python_ranges < MAX_RANGES &&
            (strcmp(file, exe) == 0 || strstr(file, "/libpython") != NULL)) {
            target->python_text[target->python_ranges][0] = start;
            target->python_text[target->python_ranges][1] = end;
            target->python_ranges++;
        }
    }
    fclose(maps);
    return 1;
}

/* --- the target's C library, as a file we can read -------------------------------------- */

/* Whether `path` is the file /proc/PID/maps shows mapped: 2 same device and inode, 1 same inode
 * (overlayfs reports the inode of the layer below under a device of its own), 0 neither. */
static int maps_file_match(const struct target *target, const char *path) {
    struct stat info;
    if (stat(path, &info) != 0) return 0;
    if (info.st_ino != target->libc_inode) return 0;
    return major(info.st_dev) == target->libc_major && minor(info.st_dev) == target->libc_minor ? 2 : 1;
}

/* Where we can read the libc the target has mapped. /proc/PID/maps names a file by its path
 * from *our* root: for a job in a chroot in our mount namespace that is the chroot's directory
 * plus the path the job knows; for one in a container that pivoted its root, the path the
 * container knows, reached under /proc/PID/root; for a chroot inside another mount namespace,
 * neither (the path starts at that namespace's root). Reading the wrong libc would put dlopen
 * at a wrong address in the target, so a candidate is taken only if it is the mapped file:
 *   1. /proc/PID/map_files/START-END: the mapping itself, whatever the paths (needs
 *      CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE: root outside a container);
 *   2. /proc/PID/root + the path; the path as it is; and /proc/PID/root + the path with the
 *      chroot's directory (what /proc/PID/root reads as) cut off its front: whichever has the
 *      device and inode that the maps line shows (or, on overlayfs, its inode);
 *   3. failing all, /proc/PID/root + the path if it exists, as before chroots were handled. */
static int find_libc_file(struct target *target) {
    char candidates[4][PATH_MAX + 64], link[64], root[PATH_MAX];
    snprintf(candidates[0], sizeof candidates[0], "/proc/%d/map_files/%lx-%lx", target->pid, target->libc_base,
             target->libc_end);
    snprintf(candidates[1], sizeof candidates[1], "/proc/%d/root%s", target->pid, target->libc);
    snprintf(candidates[2], sizeof candidates[2], "%s", target->libc);
    candidates[3][0] = '\0';
    snprintf(link, sizeof link, "/proc/%d/root", target->pid);
    ssize_t length = readlink(link, root, sizeof root - 1);
    if (length > 1 && strncmp(target->libc, root, (size_t)length) == 0 && target->libc[length] == '/')
        snprintf(candidates[3], sizeof candidates[3], "%s%s", link, target->libc + length);
    int fd = open(candidates[0], O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        snprintf(target->libc_file, sizeof target->libc_file, "%s", candidates[0]);
        return 1;
    }
    for (int wanted = 2; wanted >= 1; wanted--)
        for (int i = 1; i < 4; i++)
            if (candidates[i][0] && maps_file_match(target, candidates[i]) == wanted) {
                snprintf(target->libc_file, sizeof target->libc_file, "%s", candidates[i]);
                return 1;
            }
    if (access(candidates[1], R_OK) == 0) {
        say("no file matches the inode of %s in PID %d's maps; reading %s", target->libc, target->pid, candidates[1]);
        snprintf(target->libc_file, sizeof target->libc_file, "%s", candidates[1]);
        return 1;
    }
    return 0;
}

int resolve(struct target *target, const char *helper) {
    if (!read_maps(target)) {
        int error = errno;
        return fail(error == EACCES || error == EPERM ? "permission" : "exited", "cannot read /proc/%d/maps: %s",
                    target->pid, strerror(error));
    }
    if (!target->libc_base) return fail("no_libc", "no C library is mapped in PID %d", target->pid);
    if (!find_libc_file(target))
        return fail("no_libc_file",
                    "cannot read the C library of PID %d (%s): not through /proc/%d/map_files, not under "
                    "/proc/%d/root, not at that path, not under the chroot's root",
                    target->pid, target->libc, target->pid, target->pid);
    const char *file = target->libc_file;
    uint64_t value, lowest;
    if (elf_symbol(file, "dlopen", &value, &lowest)) {
        target->dlopen_is_private = 0;
    } else if (elf_symbol(file, "__libc_dlopen_mode", &value, &lowest)) {
        target->dlopen_is_private = 1;
    } else {
        return fail("no_dlopen", "no dlopen in %s (read as %s)", target->libc, file);
    }
    /* The mapping at file offset 0 is where the lowest PT_LOAD segment landed. */
    target->dlopen = target->libc_base + value - lowest;
    /* Added to the link_map's l_addr (the load bias), not to a mapping's start. */
    if (!elf_symbol(helper, "probing_helper_start", &target->start_offset, NULL))
        return fail("bad_helper", "%s has no probing_helper_start", helper);
    say("libc %s (read as %s) at 0x%lx, dlopen at 0x%lx%s", target->libc, file, target->libc_base, target->dlopen,
        target->dlopen_is_private ? " (__libc_dlopen_mode)" : "");
    return 0;
}
